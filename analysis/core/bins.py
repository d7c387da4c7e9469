"""Timestep bins: K contiguous, inclusive ranges that partition 0..T-1 with no gaps and no overlaps.

Bin ``k`` is ``[lo_k, hi_k]`` inclusive with ``lo_{k+1} = hi_k + 1``, so every timestep is sampled (bins written
``(0,100),(101,200),...`` with an exclusive upper bound never sample 100, 200, ...: docs/design.md).
"""

from __future__ import annotations

import numpy as np


def timestep_bins(num_bins: int, num_timesteps: int = 1000) -> list[tuple[int, int]]:
    """Inclusive ``(lo, hi)`` ranges of ``num_bins`` near-equal bins covering ``0..num_timesteps-1``."""
    if not 1 <= num_bins <= num_timesteps:
        raise ValueError(f"timestep_bins must be between 1 and {num_timesteps}, got {num_bins}")
    edges = [(k * num_timesteps) // num_bins for k in range(num_bins + 1)]
    return [(edges[k], edges[k + 1] - 1) for k in range(num_bins)]


def bin_of(timesteps: np.ndarray, num_bins: int, num_timesteps: int = 1000) -> np.ndarray:
    """Bin index of each timestep (inverse of :func:`timestep_bins`)."""
    t = np.asarray(timesteps, dtype=np.int64)
    if t.size and (t.min() < 0 or t.max() >= num_timesteps):
        raise ValueError(f"timesteps must lie in 0..{num_timesteps - 1}")
    lows = np.array([lo for lo, _ in timestep_bins(num_bins, num_timesteps)], dtype=np.int64)
    return np.searchsorted(lows, t, side="right") - 1
