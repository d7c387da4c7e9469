"""A batch-size schedule as piecewise-constant stages: which batch size, learning-rate factor and how many
examples at a given optimizer step.

A trial's ``batch_schedule`` is a list of ``[step, batch_size]`` pairs: the trial starts at its ``batch_size``
and, once ``step`` optimizer steps are done, every later step uses the new batch size (Merrill et al. 2025,
arXiv 2505.23971: double B as the local critical batch size grows; Smith et al. 2018, arXiv 1711.00489). The
trial realises a stage's ``B`` by its gradient accumulation ``A = B / (micro x W)`` (micro-batch and workers stay
fixed), so every stage's B must be a multiple of ``unit = micro x W``. The learning rate of a stage is the base
lr times ``analysis.branch.lr_factor(rule, B / B_0)`` -- the same rule a branched study uses for its branches
(``sqrt`` for Adam, ``linear`` for SGD).

Counters (``REFERENCE.md``): after ``n`` steps the trial has consumed ``examples(n) = sum over steps i < n of
B(i)`` examples and done ``examples(n) / unit`` micro-steps per worker. Pure Python (used by the trainables, the
NQM closed form and the proposal in ``analysis.schedule``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from analysis.branch import LR_RULES, lr_factor

__all__ = ["BatchStages", "LR_RULES"]


@dataclass(frozen=True)
class BatchStages:
    """Stage ``k`` covers the optimizer steps with index ``starts[k] <= i < starts[k+1]`` (``i`` = steps already
    done) at batch size ``sizes[k]``; ``starts[0] == 0``."""

    starts: tuple[int, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.starts or self.starts[0] != 0 or len(self.starts) != len(self.sizes):
            raise ValueError("stages need starts[0] == 0 and one batch size per start")

    @classmethod
    def from_schedule(cls, batch_size: int, schedule: list, unit: int = 1) -> BatchStages:
        """The stages of a trial starting at ``batch_size`` with ``schedule = [[step, B], ...]``; raises one-line
        ``ValueError`` naming the bad entry and the fix."""
        starts, sizes = [0], [int(batch_size)]
        for i, entry in enumerate(schedule or []):
            ok = isinstance(entry, (list, tuple)) and len(entry) == 2
            if not ok or any(isinstance(v, bool) or not isinstance(v, int) for v in entry):
                raise ValueError(
                    f"batch_schedule entry {i} must be a [step, batch_size] pair of integers, got {entry!r}"
                )
            step, b = entry
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
        return cls(tuple(starts), tuple(sizes))

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

    def lr_factor(self, step: int, rule: str) -> float:
        """Learning-rate multiplier of the step taken with ``step`` steps done (1 in stage 0)."""
        k = self.index(step)
        return 1.0 if k == 0 else lr_factor(rule, self.sizes[k] / self.sizes[0])

    def to_list(self) -> list[list[int]]:
        """The ``batch_schedule`` list (stage 0 is the trial's ``batch_size``)."""
        return [[s, b] for s, b in zip(self.starts[1:], self.sizes[1:], strict=True)]
