"""The noisy quadratic model with timestep bins of known, different noise, trained under an allocation: the exact
expected loss, hence the exact gain in steps-to-target of a sampler (docs/allocation.md).

K bins with shares ``q_k``; an example of bin k has gradient ``Hθ + ξ``, ``Cov ξ = s_k C`` (the NQM's ``C ∝ H``),
with ``sum_k q_k s_k = 1``, so uniform sampling has exactly the plain NQM's per-example noise ``C``
(``tests.oracles.nqm``). Every bin shares the mean gradient ``Hθ``: the objective is the NQM's loss. Drawing bin k
with
probability ``p_k`` and weighting by ``w_k = q_k / p_k`` (``analysis.core.allocation``) keeps ``E g = Hθ``; the weighted
per-example gradient has covariance

    (a - 1) HθθᵀH + s̄ C,       a = sum_k q_k^2 / p_k >= 1,   s̄ = sum_k q_k^2 s_k / p_k

(the first term: weights != 1 also scale the mean gradient). A batch of B iid examples divides it by B, and SGD
``θ' = θ - lr g`` gives per coordinate (the cross terms vanish as in the plain NQM)

    E[θ_i'^2] = [(1 - lr h_i)^2 + lr^2 (a - 1) h_i^2 / B] E[θ_i^2] + lr^2 s̄ c_i / B,

the plain recursion with ``c -> s̄ c`` and an extra ``lr^2 (a-1) h^2 / B`` in its factor
(``tests.oracles.nqm._loss_at``,
``mult``). Its closed form gives the expected loss, steps-to-target per (B, lr), and with the lr tuned per batch
size the exact ratio of steps of a sampler to the uniform one. :func:`weighted_noise` is the trial's draw
(``trainables.nqm_trial``), so :func:`simulate` checks the closed form against the trial's own sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.core.nqm_noise import weighted_noise
from tests.oracles.nqm import _arrays, _crossings, _loss_at, default_lrs


def terms(s: np.ndarray, q: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """``(a - 1, s̄)`` of the module docstring for allocation ``p``."""
    s, q, p = _arrays(s, q, p)
    return float(np.sum(q * q / p) - 1.0), float(np.sum(q * q * s / p))


def expected_loss(h, c, theta0_sq, lr: float, B: float, steps: int, s, q, p) -> np.ndarray:
    """``E L(t)``, ``t = 0..steps``, under allocation ``p`` (exact closed form; ``inf`` where diverged)."""
    h, c, m0 = _arrays(h, c, theta0_sq)
    mult, sbar = terms(s, q, p)
    return _loss_at(h, sbar * c, m0, np.array([float(lr)]), B, np.arange(steps + 1), mult=mult)[0]


@dataclass(frozen=True)
class SamplerGain:
    """Exact best-lr steps-to-target per batch size, uniform vs an allocation, and their ratio."""

    batch_sizes: np.ndarray  # (n_B,)
    steps_uniform: np.ndarray  # (n_B,)
    steps_alloc: np.ndarray  # (n_B,)
    lr_uniform: np.ndarray
    lr_alloc: np.ndarray

    @property
    def ratio(self) -> np.ndarray:
        return self.steps_alloc / self.steps_uniform


def best_steps(h, c, theta0_sq, B: float, target: float, s, q, p, lrs=None, max_steps: int = 20_000):
    """``(fewest expected steps to target over lrs, its lr)`` at batch size ``B`` under allocation ``p``."""
    h, c, m0 = _arrays(h, c, theta0_sq)
    lrs = default_lrs(h) if lrs is None else np.asarray(lrs, np.float64)
    mult, sbar = terms(s, q, p)
    steps = _crossings(h, sbar * c, m0, lrs, float(B), target, max_steps, best=True, mult=mult)
    k = int(np.argmin(steps))
    return float(steps[k]), float(lrs[k])


def gain(h, c, theta0_sq, batch_sizes, target: float, s, q, p, lrs=None, max_steps: int = 20_000) -> SamplerGain:
    """Exact gain of allocation ``p`` over uniform (``q``) in best-lr steps-to-target per batch size."""
    rows = [
        (*best_steps(h, c, theta0_sq, b, target, s, q, q, lrs, max_steps),
         *best_steps(h, c, theta0_sq, b, target, s, q, p, lrs, max_steps))
        for b in batch_sizes
    ]  # fmt: skip
    r = np.array(rows, dtype=np.float64).reshape(-1, 4)
    return SamplerGain(np.asarray(batch_sizes, np.float64), r[:, 0], r[:, 2], r[:, 1], r[:, 3])


def simulate(h, c, theta0, lr: float, B: int, steps: int, s, q, p, runs: int, seed: int) -> np.ndarray:
    """Mean over ``runs`` independent SGD runs of the loss at ``t = 0..steps`` under allocation ``p``."""
    h, c, theta0 = _arrays(h, c, theta0)
    theta = np.tile(theta0, (runs, 1))
    rng = np.random.default_rng(seed)
    out = np.empty((runs, steps + 1))
    for t in range(steps + 1):
        out[:, t] = 0.5 * (h * theta**2).sum(-1)
        if t < steps:
            theta = theta - lr * weighted_noise(rng, theta, h, c, B, s, q, p)
    return out
