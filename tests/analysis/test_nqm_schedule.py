"""The NQM's expected loss under a batch-size schedule (tests.oracles.nqm_schedule) against float64 brute force:
the
second-moment recursion iterated step by step, and the sampled trial's mean over many runs."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.core.stages import BatchStages
from tests.oracles.nqm import expected_loss_curve, expected_steps_to_target
from tests.oracles.nqm_schedule import expected_loss_staged, expected_to_target_staged

H = np.arange(1, 51, dtype=np.float64) ** -0.5
C, M0 = H.copy(), np.ones(50)
STAGES = BatchStages.from_schedule(8, [[40, 32], [90, 128]])
LRS = [0.4, 0.9, 1.5]


def recursion(stages: BatchStages, lrs, steps: int) -> np.ndarray:
    """``E L(t)``, ``t = 0..steps``, by iterating ``m' = (1 - lr h)² m + lr² c / B`` one step at a time."""
    m, out = M0.copy(), [0.5 * (H * M0).sum()]
    for i in range(steps):
        k = stages.index(i)
        lr, b = lrs[k], stages.sizes[k]
        m = (1 - lr * H) ** 2 * m + lr**2 * C / b
        out.append(0.5 * (H * m).sum())
    return np.array(out)


def test_staged_closed_form_is_the_recursion():
    got = expected_loss_staged(H, C, M0, STAGES, LRS, 200)
    np.testing.assert_allclose(got, recursion(STAGES, LRS, 200), rtol=1e-12)
    assert len(got) == 201


def test_one_stage_is_the_constant_closed_form():
    one = BatchStages.from_schedule(32, [])
    want = expected_loss_curve(H, C, M0, 0.7, 32, 300)
    np.testing.assert_allclose(expected_loss_staged(H, C, M0, one, [0.7], 300), want, rtol=1e-13)
    target = 0.6 * 0.5 * H.sum()
    steps, examples = expected_to_target_staged(H, C, M0, one, [0.7], target, 5000)
    assert steps == pytest.approx(expected_steps_to_target(H, C, M0, 0.7, 32, target, 5000), rel=1e-12)
    assert examples == pytest.approx(32 * steps, rel=1e-12)


def test_crossing_steps_and_examples_interpolate_between_integer_steps():
    curve = recursion(STAGES, LRS, 400)
    target = float(curve[100] * 0.5 + curve[101] * 0.5)  # halfway between steps 100 and 101 (stage 2, B = 128)
    steps, examples = expected_to_target_staged(H, C, M0, STAGES, LRS, target, 400)
    assert steps == pytest.approx(100.5, abs=1e-9)
    assert examples == pytest.approx(40 * 8 + 50 * 32 + 10 * 128 + 64, rel=1e-12)
    assert expected_to_target_staged(H, C, M0, STAGES, LRS, 1e-9, 400) == (np.inf, np.inf)


def test_sampled_trials_average_to_the_closed_form():
    """The realised schedule (trainables.nqm_trial's update with each stage's B and lr) over 4000 runs."""
    rng = np.random.default_rng(0)
    theta = np.ones((4000, 50))
    means = [0.5 * (H * theta**2).sum(1).mean()]
    for i in range(120):
        k = STAGES.index(i)
        lr, b = LRS[k], STAGES.sizes[k]
        theta = theta - lr * (H * theta + np.sqrt(C / b) * rng.standard_normal(theta.shape))
        means.append(0.5 * (H * theta**2).sum(1).mean())
    np.testing.assert_allclose(means, expected_loss_staged(H, C, M0, STAGES, LRS, 120), rtol=0.03)
