"""The closed form of the branched NQM (tests.oracles.nqm.branch_losses / branched_critical_k) against Monte Carlo
SGD runs (tests.oracles.nqm.simulate) started from the same state."""

from __future__ import annotations

import numpy as np
import pytest

from tests.oracles.nqm import branch_losses, branched_critical_k, simulate

DIM = 40
H = np.arange(1, DIM + 1, dtype=np.float64) ** -0.5
C = 2.0 * H


@pytest.mark.parametrize("rule", ["linear", "sqrt", "constant"])
def test_branch_losses_match_simulation(rule):
    rng = np.random.default_rng(0)
    theta = rng.normal(size=DIM) * 0.5
    lr0, b0, delta = 0.2, 4, 192  # every evaluation at an integer step of every branch
    fractions = np.array([0.5, 0.75, 1.0])
    ks = np.array([1.0, 2.0, 4.0])
    closed = branch_losses(H, C, theta**2, lr0, b0, ks, delta, fractions, rule)
    from analysis.core.lr_rules import lr_factor

    for k, want in zip(ks, closed, strict=True):
        b = int(k * b0)
        steps = delta // b
        runs = np.tile(theta, (20000, 1))
        ev, loss = simulate(H, C, runs, lr0 * lr_factor(rule, k), b, steps, seed=int(k))
        at = np.rint(fractions * delta / b).astype(int)
        mc = loss[:, at].mean()  # mean over runs and over the window's evaluations
        se = loss[:, at].mean(axis=1).std() / np.sqrt(len(runs))
        assert mc == pytest.approx(want, abs=4 * se + 1e-12)


def test_critical_k_solves_the_tolerance_equation():
    m0 = np.full(DIM, 0.3)
    fr = np.array([1.0])
    k = branched_critical_k(H, C, m0, 0.1, 8, 2048, 0.03, fr, "linear")
    base = branch_losses(H, C, m0, 0.1, 8, np.array([1.0]), 2048, fr, "linear")[0]
    at = branch_losses(H, C, m0, 0.1, 8, np.array([k, 0.98 * k, 1.02 * k]), 2048, fr, "linear") / base - 1
    assert at[0] == pytest.approx(0.03, abs=1e-6)
    assert at[1] < 0.03 < at[2]  # the excess grows with k through the crossing
    assert branched_critical_k(H, C, m0, 0.1, 8, 2048, 10.0, fr, "linear", k_max=8.0) == float("inf")
