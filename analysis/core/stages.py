"""A batch-size schedule as piecewise-constant stages: which batch size, learning rate and how many examples at a
given optimizer step.

A trial's ``batch_schedule`` is a list of ``[step, batch_size]`` (or ``[step, batch_size, lr]``) entries: the trial
starts at its ``batch_size`` and, once ``step`` optimizer steps are done, every later step uses the new batch size
(raise B as the local critical batch size grows: docs/schedule.md). A stage's ``B`` is reached by gradient
accumulation ``A = B / (micro x W)`` (micro-batch and workers fixed), so every B must be a multiple of ``unit = micro
x W``. A stage's learning rate is the entry's own ``lr`` if given, else the trial's lr times
``analysis.core.lr_rules.lr_factor(rule, B / B_0)`` (``sqrt`` for Adam, ``linear`` for SGD, as for branches).

Counters: after ``n`` steps the trial has consumed ``examples(n) = sum over steps i < n of B(i)`` examples and done
``examples(n) / unit`` micro-steps per worker. Pure Python (the trainables, the NQM closed form,
``analysis.features.schedule.schedule``)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from analysis.core.lr_rules import LR_RULES, lr_factor

__all__ = ["BatchStages", "LR_RULES"]


def _entry(i: int, entry) -> tuple[int, int, float | None]:
    """``(step, batch_size, lr or None)`` of one ``batch_schedule`` entry; one-line ``ValueError`` otherwise."""
    ok = isinstance(entry, (list, tuple)) and len(entry) in (2, 3)
    if not ok or any(isinstance(v, bool) or not isinstance(v, int) for v in entry[:2]):
        raise ValueError(
            f"batch_schedule entry {i} must be [step, batch_size] (integers) or [step, batch_size, lr], got {entry!r}"
        )
    lr = entry[2] if len(entry) == 3 else None
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf):
        raise ValueError(f"batch_schedule entry {i}: lr must be a positive number, got {lr!r}")
    return entry[0], entry[1], None if lr is None else float(lr)


@dataclass(frozen=True)
class BatchStages:
    """Stage ``k`` covers the optimizer steps with index ``starts[k] <= i < starts[k+1]`` (``i`` = steps already
    done) at batch size ``sizes[k]``; ``starts[0] == 0``."""

    starts: tuple[int, ...]
    sizes: tuple[int, ...]
    lrs: tuple[float | None, ...] | None = None  # a stage's own lr; None: the trial's lr x the rule's factor

    def __post_init__(self) -> None:
        if not self.starts or self.starts[0] != 0 or len(self.starts) != len(self.sizes):
            raise ValueError("stages need starts[0] == 0 and one batch size per start")
        if self.lrs is not None and (len(self.lrs) != len(self.sizes) or self.lrs[0] is not None):
            raise ValueError("stages' lrs need one entry per stage, None for stage 0 (the trial's lr)")

    @classmethod
    def from_schedule(cls, batch_size: int, schedule: list, unit: int = 1) -> BatchStages:
        """The stages of a trial starting at ``batch_size`` with ``schedule = [[step, B(, lr)], ...]``; raises a
        one-line ``ValueError`` naming the bad entry and the fix."""
        starts, sizes, lrs = [0], [int(batch_size)], [None]
        for i, entry in enumerate(schedule or []):
            step, b, lr = _entry(i, entry)
            if step <= starts[-1]:
                raise ValueError(
                    f"batch_schedule steps must be increasing and >= 1 (the trial's batch_size is stage 0), "
                    f"got step {step} after {starts[-1]}"
                )
            if b < 1 or b % unit:
                raise ValueError(
                    f"batch_schedule batch size {b} at step {step} is not a multiple of micro_batch_size x workers "
                    f"= {unit} (a stage changes only the accumulation); pick a multiple of {unit}"
                )
            starts.append(step)
            sizes.append(b)
            lrs.append(lr)
        return cls(tuple(starts), tuple(sizes), tuple(lrs) if any(v is not None for v in lrs) else None)

    @property
    def constant(self) -> bool:
        return len(self.sizes) == 1

    def index(self, step: int) -> int:
        """The stage of optimizer step index ``step`` (``step`` steps done)."""
        return bisect.bisect_right(self.starts, step) - 1

    def batch(self, step: int) -> int:
        """Batch size of the optimizer step taken with ``step`` steps done."""
        return self.sizes[self.index(step)]

    def examples(self, steps: int) -> int:
        """Examples consumed by the first ``steps`` optimizer steps (``sum_{i < steps} B(i)``)."""
        total, k = 0, self.index(steps)
        for j in range(k):
            total += self.sizes[j] * (self.starts[j + 1] - self.starts[j])
        return total + self.sizes[k] * (steps - self.starts[k])

    def lr(self, step: int, base_lr: float, rule: str) -> float:
        """Learning rate of the step taken with ``step`` steps done: ``base_lr`` in stage 0, a stage's own lr, or
        ``base_lr x lr_factor(rule, B / B_0)``."""
        k = self.index(step)
        if k == 0:
            return base_lr
        own = self.lrs[k] if self.lrs is not None else None
        return own if own is not None else base_lr * lr_factor(rule, self.sizes[k] / self.sizes[0])
