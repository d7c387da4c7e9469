"""How much a trial is expected to narrow an interval: the fit linearized, the per-seed variance, P(best setting)."""

from __future__ import annotations

import numpy as np
from scipy import special

from analysis.features.adaptive.bin_goals import rel_width
from analysis.features.adaptive.decision import _same_lr
from analysis.fits.steps import steps_to_target
from analysis.sources.loaders import Runs

SIGMA2_FLOOR = 1e-4  # per-seed variance of log steps never taken below (1% sd): no candidate is worth nothing


class _Model:
    """The linearized fit of one interval: ``log S(B) = log(S_min + E_min/B)`` is, near the fit, linear in
    ``p = (log S_min, log E_min)`` with the row ``g(B) = (S_min, E_min/B) / S(B)`` per point; a point of ``k`` seeds
    weighs ``k/σ²``, ``F = Σ w g g'``, and ``Var log B_crit ≈ a' F⁻¹ a`` with ``a = (-1, 1)``."""

    def __init__(self, fit: dict, sigma2: float):
        self.s_min, self.e_min, self.sigma2 = fit["s_min"], fit["e_min"], sigma2
        self.width = rel_width(fit)
        self.F = np.zeros((2, 2))
        for p in fit["points"]:
            self.add(p["batch_size"], p["seeds"])

    def row(self, b: float) -> np.ndarray:
        return np.array([self.s_min, self.e_min / b]) / (self.s_min + self.e_min / b)

    def add(self, b: float, k: float = 1.0) -> None:
        g = self.row(b)
        self.F += k / self.sigma2 * np.outer(g, g)

    def var(self, F: np.ndarray | None = None) -> float:
        F = self.F if F is None else F
        a = np.array([-1.0, 1.0])
        if np.linalg.det(F) < 1e-12 * max(float(np.trace(F)) ** 2, 1e-300):
            return np.inf  # singular, or not positive definite (more seeds removed at a B than this fit holds)
        return float(a @ np.linalg.solve(F, a))

    def narrowing(self, b: float, k: float = 1.0, remove: bool = False) -> float:
        """Expected drop of the relative half-width from adding (or, ``remove``: the value of) ``k`` seeds at b:
        ``w (1 - sqrt(v'/v))``, ``w`` the bootstrap interval's measured relative half-width (the linearization
        only scales it), ``v'`` the variance after the rank-one update."""
        g = self.row(b)
        dF = k / self.sigma2 * np.outer(g, g)
        v = self.var()
        if remove:  # the point's value: the width with it vs without it
            v_without = self.var(self.F - dF)
            return self.width if not np.isfinite(v_without) else self.width * (1 - np.sqrt(v / v_without))
        if not np.isfinite(v):
            return self.width if np.isfinite(self.width) else 1.0
        return self.width * (1 - np.sqrt(self.var(self.F + dF) / v))


def _target_steps(runs: Runs, fit: dict, metric: str) -> np.ndarray:
    """Every trial's steps to the fit's target on ``metric`` (inf: not reached)."""
    return steps_to_target(runs.series(metric), len(runs.trial_ids), [fit["target"]])[0]


def p_better(mean_a: float, k_a: int, mean_b: float, k_b: int, sigma2: float) -> float:
    """P(setting a's true mean log steps < setting b's) under a normal approximation: ``Φ((mean_b - mean_a) /
    sqrt(σ² (1/k_a + 1/k_b)))`` from the measured means of log steps over ``k_a`` and ``k_b`` seeds."""
    z = (mean_b - mean_a) / np.sqrt(sigma2 * (1.0 / k_a + 1.0 / k_b))
    return float(0.5 * special.erfc(-z / np.sqrt(2.0)))


def _p_best(runs: Runs, steps: np.ndarray, fit: dict, b: int, lr: float, sigma2: float) -> float:
    """P that the tried setting (b, lr) is the best at b in this fit (a neighbour's ``seed`` candidate): 1 at the
    fit's best lr; against it, :func:`p_better` on the finished seeds; 0 where a seed of (b, lr) has not reached the
    target (diverged, or stopped above it), where none has finished, or where the fit has no point at b."""
    best = next((p for p in fit["points"] if p["batch_size"] == b), None)
    if best is None:
        return 0.0
    if _same_lr(best["lr"], lr):
        return 1.0
    lrs = runs.trials.column("lr").to_numpy().astype(float)
    mine = [i for i in range(len(runs.trial_ids)) if runs.batch_size[i] == b and _same_lr(lrs[i], lr)]
    x = steps[mine]
    y = steps[[runs.trial_ids.index(t) for t in best["trial_ids"]]]
    if not len(x) or not np.all(np.isfinite(x)) or not np.all(np.isfinite(y)):
        return 0.0
    return p_better(float(np.log(x).mean()), len(x), float(np.log(y).mean()), len(y), sigma2)


def _sigma2(runs: Runs, fit: dict, metric: str, steps: np.ndarray | None = None) -> float:
    """Pooled per-seed variance of log steps at this target over settings with >= 2 seeds (else the fit's mean
    squared log residual), floored at SIGMA2_FLOOR."""
    steps = _target_steps(runs, fit, metric) if steps is None else steps
    ss, dof = 0.0, 0
    for p in fit["points"]:
        rows = [runs.trial_ids.index(t) for t in p["trial_ids"]]
        x = np.log(steps[rows])
        if len(x) >= 2 and np.all(np.isfinite(x)):
            ss, dof = ss + float(((x - x.mean()) ** 2).sum()), dof + len(x) - 1
    if dof == 0:
        b = np.array([p["batch_size"] for p in fit["points"]], float)
        s = np.array([p["steps"] for p in fit["points"]], float)
        r = np.log(s) - np.log(fit["s_min"] + fit["e_min"] / b)
        return max(float(np.mean(r**2)) * len(r) / max(len(r) - 2, 1), SIGMA2_FLOOR)
    return max(ss / dof, SIGMA2_FLOOR)
