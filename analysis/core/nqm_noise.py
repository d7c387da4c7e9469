"""The noisy quadratic model's timestep bins as the ``quadratic`` trial draws them (``trainables.nqm_trial``): each
bin's noise scale, the ``noise`` sampler's allocation and one step's importance-weighted batch gradient. Their
closed forms are checked in the tests (tests/oracles/nqm_alloc.py; docs/allocation.md)."""

from __future__ import annotations

import numpy as np

from analysis.core.allocation import mix_floor

__all__ = ["bin_noise", "noise_allocation", "weighted_noise"]


def bin_noise(num_bins: int, ratio: float) -> np.ndarray:
    """``s_k ∝ ratio^(k/(K-1))`` over K equal bins, normalised to mean 1 (uniform = the plain NQM's noise)."""
    if num_bins < 1 or not ratio > 0:
        raise ValueError(f"need num_bins >= 1 and ratio > 0, got {num_bins}, {ratio}")
    s = ratio ** (np.arange(num_bins) / max(num_bins - 1, 1))
    return s / s.mean()


def noise_allocation(s: np.ndarray, q: np.ndarray, floor: float) -> np.ndarray:
    """The NQM's ``noise`` sampler: ``p_k ∝ q_k sqrt(s_k)`` with a uniform floor -- Neyman allocation in the
    noise-dominated limit (``m_k ≈ s_k tr C``), from the known per-bin noise (no measurement)."""
    q = np.asarray(q, np.float64)
    raw = q * np.sqrt(np.asarray(s, np.float64))
    return mix_floor(raw / raw.sum(), q, floor)


def weighted_noise(rng: np.random.Generator, theta, h, c, B: int, s, q, p) -> np.ndarray:
    """One step's weighted batch gradient for ``theta`` (R, d) or (d,): bins of the B examples by
    ``multinomial(B, p)``, each bin's summed noise exactly ``N(0, n_k s_k C)``, weights ``q_k / p_k``."""
    theta = np.asarray(theta, np.float64)
    batch = theta.shape[:-1]
    n = rng.multinomial(B, p, size=batch)  # (..., K) examples per bin
    w = np.asarray(q) / np.asarray(p)  # (K,)
    z = rng.standard_normal((*batch, len(p), theta.shape[-1]))  # (..., K, d)
    noise = np.einsum("...k,...kd->...d", w * np.sqrt(n * np.asarray(s)), z) * np.sqrt(c)  # sum of weighted noises
    mean_factor = (n * w).sum(-1, keepdims=True)  # (..., 1) sum_j w_j
    return (mean_factor * h * theta + noise) / B
