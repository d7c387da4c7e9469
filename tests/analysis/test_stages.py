"""Batch-size stages (analysis.core.stages): counters against a brute-force sum over steps, validation, lr factors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.core.stages import BatchStages


def brute_examples(stages: BatchStages, n: int) -> int:
    return sum(stages.batch(i) for i in range(n))


@pytest.mark.parametrize("seed", range(5))
def test_examples_are_the_sum_of_every_steps_batch(seed):
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.choice(np.arange(1, 60), size=rng.integers(1, 5), replace=False))
    schedule = [[int(s), int(8 * rng.integers(1, 9))] for s in starts]
    stages = BatchStages.from_schedule(8 * int(rng.integers(1, 9)), schedule, unit=8)
    for n in range(80):
        assert stages.examples(n) == brute_examples(stages, n)
    # the stage of a step: the last schedule entry whose step is <= the steps done
    assert [stages.batch(i) for i in range(80)] == [
        next((b for s, b in reversed(schedule) if i >= s), stages.sizes[0]) for i in range(80)
    ]


def test_no_schedule_is_the_constant_batch():
    stages = BatchStages.from_schedule(32, [], unit=16)
    assert stages.constant and (stages.starts, stages.sizes) == ((0,), (32,))
    assert [stages.examples(n) for n in (0, 1, 7)] == [0, 32, 224]
    assert stages.lr(100, 0.3, "sqrt") == 0.3


def test_lr_follows_the_rule_of_the_stage_or_its_own():
    stages = BatchStages.from_schedule(16, [[10, 64], [20, 32]], unit=16)
    assert stages.lr(9, 0.1, "sqrt") == 0.1
    assert stages.lr(10, 0.1, "sqrt") == pytest.approx(0.2)
    assert stages.lr(19, 0.1, "linear") == pytest.approx(0.4)
    assert stages.lr(25, 0.1, "sqrt") == pytest.approx(0.1 * math.sqrt(2))
    assert stages.lr(25, 0.1, "constant") == 0.1
    assert (stages.starts, stages.sizes, stages.lrs) == ((0, 10, 20), (16, 64, 32), None)
    own = BatchStages.from_schedule(16, [[10, 64, 0.5], [20, 32]], unit=16)
    assert (own.lr(12, 0.1, "sqrt"), own.lr(20, 0.1, "linear")) == (0.5, pytest.approx(0.2))
    assert (own.starts, own.sizes, own.lrs) == ((0, 10, 20), (16, 64, 32), (None, 0.5, None))


@pytest.mark.parametrize(
    "schedule, words",
    [
        ([[10, 48]], "not a multiple of micro_batch_size x workers = 32"),
        ([[10, 64], [10, 128]], "increasing"),
        ([[0, 64]], "increasing"),
        ([[10]], "must be \\[step, batch_size\\]"),
        ([[10, 64.5]], "must be \\[step"),
        ([[10, 0]], "multiple"),
        ([[10, 64, -1.0]], "lr must be a positive number"),
        ([[10, 64, 0.1, 2]], "batch_size, lr"),
    ],
)
def test_bad_schedules_are_one_line(schedule, words):
    with pytest.raises(ValueError, match=words) as e:
        BatchStages.from_schedule(32, schedule, unit=32)
    assert "\n" not in str(e.value)
