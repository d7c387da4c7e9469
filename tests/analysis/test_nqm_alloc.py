"""The binned NQM under an allocation (tests.oracles.nqm_alloc): the closed-form expected loss against a float64
Monte
Carlo of the trial's own draw (`weighted_noise`), and the exact gain in steps-to-target."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.core import nqm_noise as nn
from tests.oracles import nqm
from tests.oracles import nqm_alloc as na

DIM = 20
H = np.arange(1, DIM + 1, dtype=np.float64) ** -0.5
Q = np.full(4, 0.25)
S = nn.bin_noise(4, 30.0)


def test_bin_noise_has_mean_one_and_the_asked_spread():
    assert S.mean() == pytest.approx(1.0) and S[-1] / S[0] == pytest.approx(30.0)
    assert na.terms(S, Q, Q) == pytest.approx((0.0, 1.0))  # uniform: the plain NQM


def test_uniform_allocation_is_the_plain_nqm():
    a = na.expected_loss(H, H, np.ones(DIM), 0.5, 4, 50, S, Q, Q)
    np.testing.assert_allclose(a, nqm.expected_loss_curve(H, H, np.ones(DIM), 0.5, 4, 50), rtol=1e-12)


@pytest.mark.parametrize("p", [nn.noise_allocation(S, Q, 0.1), np.array([0.55, 0.3, 0.1, 0.05])])
def test_closed_form_matches_monte_carlo_of_the_trial_draw(p):
    runs, steps, lr, B = 4000, 40, 0.6, 2
    sim = na.simulate(H, H, np.ones(DIM), lr, B, steps, S, Q, p, runs, seed=1)
    mean, se = sim.mean(0), sim.std(0, ddof=1) / np.sqrt(runs)
    exact = na.expected_loss(H, H, np.ones(DIM), lr, B, steps, S, Q, p)
    z = np.abs(mean - exact) / np.maximum(se, 1e-12)
    assert z[1:].max() < 4.5, z.max()
    # without the (a - 1) HθθᵀH term the closed form is measurably wrong for the skewed allocation
    mult, sbar = na.terms(S, Q, p)
    wrong = nqm.expected_loss_curve(H, sbar * H, np.ones(DIM), lr, B, steps)
    if mult > 0.5:
        assert (np.abs(mean - wrong) / se)[1:].max() > 6


def test_noise_allocation_gains_at_small_batch_sizes_only():
    p = nn.noise_allocation(S, Q, 0.1)
    g = na.gain(H, H, np.ones(DIM), [1, 4, 16, 256, 4096], 0.5, S, Q, p, lrs=np.geomspace(0.02, 1.99, 60))
    assert np.all(np.isfinite(g.steps_uniform)) and np.all(np.isfinite(g.steps_alloc))
    assert g.ratio[0] < 0.9  # fewer steps where noise dominates
    assert g.ratio[-1] == pytest.approx(1.0, abs=0.1)  # little change where it does not
    assert np.all(np.diff(g.ratio) > -0.02)  # the gain shrinks with B


def test_simulated_gain_in_steps_matches_the_closed_form():
    """Steps for the mean loss of 3000 simulated runs (the trial's draw) to cross the target, uniform vs noise,
    against the closed form's expected-loss crossings: the gain itself, not only the curves."""
    from analysis.fits.steps import steps_to_target
    from analysis.sources.loaders import Series

    p, lr, B, target, steps = nn.noise_allocation(S, Q, 0.1), 0.1, 2, 0.12, 200
    got, exact = [], []
    for alloc in (Q, p):
        mean = na.simulate(H, H, np.ones(DIM), lr, B, steps, S, Q, alloc, 3000, seed=2).mean(0)
        cross = steps_to_target(Series(np.zeros(steps + 1, np.int64), np.arange(steps + 1), mean), 1, [target])
        got.append(float(cross[0, 0]))
        curve = na.expected_loss(H, H, np.ones(DIM), lr, B, steps, S, Q, alloc)
        exact.append(float(steps_to_target(Series(np.zeros(steps + 1, np.int64), np.arange(steps + 1), curve), 1,
                                           [target])[0, 0]))  # fmt: skip
    assert exact[1] / exact[0] < 0.9  # a real gain at this small batch (0.83)
    assert got[1] / got[0] == pytest.approx(exact[1] / exact[0], abs=0.03)
    assert got == pytest.approx(exact, rel=0.03)


def test_best_steps_under_an_allocation_equal_every_step_evaluated():
    """The fewest steps to target under a skewed allocation (mult > 0) from the grid-and-refine search, against the
    closed-form loss evaluated at every integer step with the crossing interpolated as analysis.fits.steps does: the
    refinement must keep the allocation's extra noise term (without it the crossing moves)."""
    from analysis.fits.steps import steps_to_target
    from analysis.sources.loaders import Series

    p, B, target, max_steps = np.array([0.55, 0.3, 0.1, 0.05]), 2, 0.2, 3000
    mult, _ = na.terms(S, Q, p)
    assert mult > 0.5
    lrs = np.geomspace(0.05, 1.5, 9)
    brute = []
    for lr in lrs:
        curve = na.expected_loss(H, H, np.ones(DIM), lr, B, max_steps, S, Q, p)
        t = np.arange(max_steps + 1)
        brute.append(steps_to_target(Series(np.zeros(len(t), np.int64), t, curve), 1, [target], local=False)[0, 0])
    k = int(np.argmin(brute))
    steps, lr = na.best_steps(H, H, np.ones(DIM), B, target, S, Q, p, lrs=lrs, max_steps=max_steps)
    assert np.isfinite(brute[k]) and lr == lrs[k]
    assert steps == pytest.approx(brute[k], rel=1e-12)


def test_closed_form_equals_the_exact_moment_recursion_of_the_draw():
    """The binned NQM's expected loss against the second-moment recursion of `weighted_noise`'s own draw, its
    moments found by enumerating every multinomial outcome of B = 3 examples in 4 bins (float64, no closed form):
    theta' = theta - lr (a h theta + xi) with a = sum_k w_k n_k / B and E[xi^2 | n] = sum_k w_k^2 n_k s_k c / B^2, so
    E theta'^2 = E theta^2 (1 - 2 lr h E a + lr^2 h^2 E a^2) + lr^2 E xi^2. Every power of h and every term counts."""
    from itertools import product

    from scipy.stats import multinomial

    p, B, lr, steps = np.array([0.55, 0.3, 0.1, 0.05]), 3, 0.6, 60
    w = Q / p
    n = np.array([o for o in product(range(B + 1), repeat=len(p)) if sum(o) == B], dtype=np.float64)
    pmf = multinomial.pmf(n, B, p)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-14)
    a = (n * w).sum(1) / B
    ea, ea2, exi2 = pmf @ a, pmf @ a**2, pmf @ (n * w**2 * S).sum(1) / B**2  # E xi^2 per unit of c
    m, curve = np.ones(DIM), []
    for _ in range(steps + 1):
        curve.append(0.5 * (H * m).sum())
        m = m * (1 - 2 * lr * H * ea + lr**2 * H**2 * ea2) + lr**2 * H * exi2  # c = H
    exact = na.expected_loss(H, H, np.ones(DIM), lr, B, steps, S, Q, p)
    np.testing.assert_allclose(exact, curve, rtol=1e-11)
