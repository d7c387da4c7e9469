"""System metrics of a trial, recorded at every report: throughput over the last report interval and peak memory.

- ``sys/examples_per_s``: training examples of the interval (``steps x batch_size``, the global batch: all workers;
  under a batch-size schedule the sum of each step's stage batch size, `analysis.core.stages`)
  over the training seconds of the interval, as the trial's `trainables.timing.StepTimer` counts them (the same
  clock as ``train_seconds``): on CPU the wall clock (``time.perf_counter``) around each step, on a GPU the time
  between two CUDA events on the trial's stream; a step's time includes its per-bin GNS pass, and excludes
  evaluation, checkpoints and reports. It is the reporting rank's (rank 0's) clock.
- ``sys/peak_mem_gb``: peak memory in GiB (2^30 bytes) of the reporting rank. On a GPU:
  ``torch.cuda.max_memory_allocated`` of the trial's device (tensors allocated by PyTorch, not the caching
  allocator's reserve), its counter reset when the training loop starts. On CPU: the peak resident set size of the
  worker process (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) since the process started -- everything the
  process holds, not only tensors (an in-process trial counts its host process, e.g. pytest's).
The peak never decreases within a trial's process; a trial resumed from a checkpoint starts a new interval (and, on
a GPU, a new peak).
"""

from __future__ import annotations

import resource
import sys

import torch

from analysis.core import metrics as M
from analysis.core.stages import BatchStages
from trainables.skeleton import ExamplesRate

GIB = 2**30


def peak_mem_gb(device: torch.device | str) -> float:
    """Peak memory in GiB: the device's peak allocated tensors on CUDA, else this process's peak resident set."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss * (1 if sys.platform == "darwin" else 1024) / GIB  # bytes on macOS, KiB on Linux


class SysMetrics:
    """``interval(step, train_seconds)`` at each report gives the `M.SYS_*` values of the steps since the last one."""

    def __init__(
        self, device: torch.device | str, batch_size: int, step: int, train_seconds: float,
        stages: BatchStages | None = None,
    ) -> None:  # fmt: skip
        self.device, self.batch_size = torch.device(device), batch_size
        self.stages = stages if stages is not None else BatchStages((0,), (batch_size,))
        self._rate = ExamplesRate(self.stages, step, train_seconds)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def interval(self, step: int, train_seconds: float) -> dict[str, float]:
        """Metrics of the steps trained since the last call (none when no step was, or no time was counted)."""
        rate = self._rate.interval(step, train_seconds)
        if rate is None:
            return {}
        return {M.SYS_EXAMPLES_PER_S: rate, M.SYS_PEAK_MEM_GB: peak_mem_gb(self.device)}
