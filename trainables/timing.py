"""Training time of a step: wall clock on CPU, CUDA events on a GPU, read without an extra host synchronisation.

On a GPU the host runs ahead of the device, so a wall clock around a step measures launches, not work. Each
step is bracketed by two CUDA events; a step's elapsed time is read one step later, once the step's own read of
its statistics (`trainables.step`, the one synchronisation per step) guarantees the previous step finished, and
``flush`` (at a report) waits for the last one.
"""

from __future__ import annotations

import time

import torch

CLOCK = time.perf_counter  # the CPU-side clock (a measurement on a shared machine may swap in time.process_time)


class StepTimer:
    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._t0 = 0.0
        self._open: torch.cuda.Event | None = None  # start event of the running step
        self._done: tuple[torch.cuda.Event, torch.cuda.Event] | None = None  # last finished step, not yet read

    def start(self) -> None:
        if not self.cuda:
            self._t0 = CLOCK()
            return
        self._open = torch.cuda.Event(enable_timing=True)
        self._open.record(torch.cuda.current_stream(self.device))  # the trial's device, whatever is current

    def stop(self) -> float:
        """Seconds to add to the training time now: this step's on CPU; on a GPU the previous step's (complete)."""
        if not self.cuda:
            return CLOCK() - self._t0
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.device))
        seconds = self.flush()  # the previous step: already finished (this step's host read waited for it)
        self._done = (self._open, end)
        return seconds

    def flush(self) -> float:
        """Seconds of the last step not yet counted (0 on CPU); at a report this may wait for the device to
        finish that step, inside ``stop`` it returns at once."""
        if not self.cuda or self._done is None:
            return 0.0
        start, end = self._done
        end.synchronize()  # elapsed_time raises on an unfinished event; a no-op wait when it is done
        self._done = None
        return start.elapsed_time(end) / 1000.0
