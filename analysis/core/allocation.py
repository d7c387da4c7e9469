"""Timestep allocation by measured gradient noise: the allocations and the predicted per-example noise, B_simple and
steps-to-target ratio under any allocation (pure numpy; docs/allocation.md).

The trial optimises ``L = sum_k q_k L_k`` over K timestep bins (``q_k`` the bin's share of the timesteps, ``L_k`` the
mean loss over ``t`` uniform in bin k, whose ``G_k`` and ``tr Sigma_k`` the per-bin GNS pass measures). Drawing bin k
with probability ``p_k`` and weighting by ``w_k = q_k / p_k`` keeps the gradient unbiased; its per-example second
moment is ``M(p) = sum_k q_k^2 m_k / p_k`` with ``m_k = tr Sigma_k + |G_k|^2``, so ``tr Sigma(p) = M(p) - |G|^2``,
least at ``p_k ∝ q_k sqrt(m_k)`` (Neyman allocation), and the steps at batch size ``B`` change by ``S_p(B) / S_u(B) =
(B + B_simple(p)) / (B + B_simple(uniform))`` (derivation: docs/design.md).

Inputs are the logged window measurements: per bin, the unbiased per-measurement ``|G_k|^2`` and ``tr Sigma_k``, and
the global per-step ``|G|^2``. Standard errors are the first-order delta method over the sample means (bins and the
global series independent), with the allocation ``p`` held fixed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analysis.core.bins import timestep_bins

__all__ = [
    "SAMPLERS",
    "AllocationPrediction",
    "bin_shares",
    "loss_allocation",
    "mix_floor",
    "noise_allocation",
    "predict",
]

SAMPLERS = ("uniform", "noise", "loss")  # config timestep_sampling: uniform (default), Neyman on m_k, loss-based

F64 = NDArray[np.float64]


def bin_shares(num_bins: int, num_timesteps: int = 1000) -> F64:
    """``q_k``: bin k's share of the timesteps (its width / T), the uniform sampler's bin probabilities."""
    return np.array([hi - lo + 1 for lo, hi in timestep_bins(num_bins, num_timesteps)], np.float64) / num_timesteps


def _check_p(p: ArrayLike, q: ArrayLike) -> tuple[F64, F64]:
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"allocation p {p.shape} and bin shares q {q.shape} must be equal-length vectors")
    if not (np.all(np.isfinite(p)) and np.all(p > 0) and abs(p.sum() - 1.0) < 1e-9):
        raise ValueError(f"an allocation needs finite p_k > 0 summing to 1, got {p.tolist()}")
    return p, q


def mix_floor(p: ArrayLike, q: ArrayLike, floor: float) -> F64:
    """``(1 - floor) p + floor q``: a uniform floor (``q``) so that no bin starves (``p_k >= floor q_k``)."""
    if not 0.0 < floor <= 1.0:
        raise ValueError(f"the uniform floor must lie in (0, 1], got {floor}")
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    out = (1.0 - floor) * p + floor * q
    return out / out.sum()


def _proportional(score: F64, q: F64, floor: float) -> F64:
    """``p ∝ q * score`` mixed with the floor; the uniform ``q`` when no score is usable (all zero / non-finite)."""
    s = np.where(np.isfinite(score), np.maximum(score, 0.0), 0.0)
    raw = q * s
    if not raw.sum() > 0.0:
        return q / q.sum()
    return mix_floor(raw / raw.sum(), q, floor)


def noise_allocation(m: ArrayLike, q: ArrayLike, floor: float) -> F64:
    """Neyman allocation ``p_k ∝ q_k sqrt(m_k)`` (minimises the weighted gradient's second moment ``M(p)``), mixed
    with a uniform floor.

    ``m_k = tr Sigma_k + |G_k|^2`` per bin; a negative or non-finite estimate counts as 0 (the floor keeps the bin).
    """
    return _proportional(np.sqrt(np.maximum(np.asarray(m, np.float64), 0.0)), np.asarray(q, np.float64), floor)


def loss_allocation(loss_sq: ArrayLike, q: ArrayLike, floor: float) -> F64:
    """improved-diffusion's ``LossSecondMomentResampler`` per bin: ``p_k ∝ q_k sqrt(E[L^2]_k)`` with a floor."""
    return _proportional(np.sqrt(np.maximum(np.asarray(loss_sq, np.float64), 0.0)), np.asarray(q, np.float64), floor)


@dataclass(frozen=True)
class AllocationPrediction:
    """Predicted noise under one allocation, from a uniform trial's per-bin and global GNS measurements."""

    name: str
    p: F64  # (K,) bin probabilities
    second_moment: float  # M(p), per example
    trace: float  # tr Sigma(p) = M(p) - |G|^2, per example
    trace_se: float
    b_simple: float  # tr Sigma(p) / |G|^2
    b_simple_se: float
    batch_sizes: F64 = field(default_factory=lambda: np.zeros(0))  # (n_B,)
    ratio: F64 = field(default_factory=lambda: np.zeros(0))  # (n_B,) S_p / S_uniform
    ratio_se: F64 = field(default_factory=lambda: np.zeros(0))


def _mean_var(x: ArrayLike, what: str) -> tuple[float, float]:
    """Sample mean and the variance of the mean (``s^2 / n``) of independent measurements (n >= 2)."""
    a = np.asarray(x, np.float64).ravel()
    a = a[np.isfinite(a)]
    if a.size < 2:
        raise ValueError(f"{what}: need >= 2 finite measurements for a standard error, got {a.size}")
    return float(a.mean()), float(a.var(ddof=1) / a.size)


def predict(
    m_samples: Sequence[ArrayLike],
    g2_samples: ArrayLike,
    allocations: Mapping[str, ArrayLike],
    q: ArrayLike,
    batch_sizes: ArrayLike = (),
) -> list[AllocationPrediction]:
    """Predicted ``tr Sigma``, ``B_simple`` and ``S_p/S_uniform`` per allocation, each with a delta-method SE.

    ``m_samples[k]``: per-measurement ``tr Sigma_k + |G_k|^2`` of bin k; ``g2_samples``: per-measurement global
    ``|G|^2``; ``allocations``: name -> ``p`` (the ratio is taken against ``q``, the uniform sampler, predicted from
    the same means so that their errors partly cancel). With ``M_p = sum c_k mbar_k``, ``c_k = q_k^2/p_k``, ``g =
    mean |G|^2``: ``B_p = M_p/g - 1`` and ``S_p/S_u = (g(B-1) + M_p) / (g(B-1) + M_u)``.
    """
    q = np.asarray(q, np.float64)
    if len(m_samples) != q.size:
        raise ValueError(f"{len(m_samples)} bins of measurements but {q.size} bin shares")
    mv = np.array([_mean_var(s, f"bin {k}") for k, s in enumerate(m_samples)])  # (K, 2)
    m_bar, m_var = mv[:, 0], mv[:, 1]
    g, g_var = _mean_var(g2_samples, "global |G|^2")
    if not g > 0:
        raise ValueError(f"the mean global |G|^2 is {g:.3g} <= 0: B_simple is undefined (train longer)")
    Bs = np.asarray(batch_sizes, np.float64).ravel()
    c_u = q  # the uniform allocation's coefficients q_k^2 / q_k
    M_u = float(c_u @ m_bar)
    out = []
    for name, p in allocations.items():
        p, _ = _check_p(p, q)
        c = q * q / p
        M = float(c @ m_bar)
        trace = M - g
        trace_se = math.sqrt(float(c * c @ m_var) + g_var)  # d/dm_k = c_k, d/dg = -1
        bs = trace / g
        bs_se = math.sqrt(float(c * c @ m_var) + (bs + 1.0) ** 2 * g_var) / g  # d/dm_k = c_k/g, d/dg = -(bs+1)/g
        D = g * (Bs - 1.0) + M_u  # (n_B,)
        N = g * (Bs - 1.0) + M
        ratio = N / D
        grad_m = (c[None, :] * D[:, None] - N[:, None] * c_u[None, :]) / (D * D)[:, None]  # (n_B, K)
        grad_g = (Bs - 1.0) * (D - N) / (D * D)
        ratio_se = np.sqrt(grad_m**2 @ m_var + grad_g**2 * g_var)
        out.append(AllocationPrediction(name, p, M, trace, trace_se, bs, bs_se, Bs, ratio, ratio_se))
    return out
