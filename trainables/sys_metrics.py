"""System metrics of a trial, recorded at every report: throughput over the last report interval and peak memory.

- ``sys/examples_per_s``: training examples of the interval (``steps x batch_size``, the global batch; under a
  batch-size schedule the sum of each step's stage batch size) over the training seconds of the interval as the
  trial's `trainables.timing.StepTimer` counts them (the clock of ``train_seconds``: ``time.perf_counter`` around
  each step on CPU, CUDA events on the trial's stream on a GPU; per-bin GNS included; evaluation, checkpoints and
  reports excluded), on the reporting rank (rank 0).
- ``sys/peak_mem_gb``: peak memory in GiB of the reporting rank: on a GPU ``torch.cuda.max_memory_allocated``
  (tensors, not the caching allocator's reserve), reset when the training loop starts; on CPU the process's peak
  resident set size (``ru_maxrss``) since it started, everything it holds (an in-process trial counts its host
  process, e.g. pytest's). It never decreases within a process; a resumed trial starts a new interval (and, on a GPU,
  a new peak)."""

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
