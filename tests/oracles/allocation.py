"""Closed forms of the timestep allocation that the product computes elsewhere (analysis.core.allocation.predict,
the trial's draw in trainables.timestep_sampler), in plain numpy, to check it against."""

from __future__ import annotations

import numpy as np


def second_moment(m, p, q) -> float:
    """``M(p) = sum_k q_k^2 m_k / p_k``: per-example second moment of the weighted gradient under allocation p."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    return float(np.sum(q * q * np.asarray(m, np.float64) / p))


def sample_bins(u, p) -> np.ndarray:
    """Bin of each uniform ``u`` in [0, 1) under allocation ``p`` (inverse CDF; the trial's draw, in numpy)."""
    cdf = np.cumsum(np.asarray(p, np.float64))
    return np.minimum(np.searchsorted(cdf / cdf[-1], np.asarray(u, np.float64), side="right"), len(cdf) - 1)
