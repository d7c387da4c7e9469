"""Timestep bins (`analysis.core.bins`): for every K and T they partition 0..T-1 into contiguous, near-equal, inclusive
ranges, and `bin_of` inverts them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.core.bins import bin_of, timestep_bins


@settings(max_examples=300, deadline=None)
@given(data=st.data(), T=st.integers(1, 3000))
def test_bins_partition_every_range(data, T: int) -> None:
    K = data.draw(st.integers(1, T))
    bins = timestep_bins(K, T)
    assert len(bins) == K
    assert bins[0][0] == 0 and bins[-1][1] == T - 1  # no gap at either end
    for (_, hi), (lo, _) in zip(bins, bins[1:], strict=False):
        assert lo == hi + 1  # contiguous: no gap, no overlap
    sizes = [hi - lo + 1 for lo, hi in bins]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1 and sum(sizes) == T  # near-equal
    t = np.arange(T)
    k = bin_of(t, K, T)
    assert k.dtype.kind == "i" and k.min() == 0 and k.max() == K - 1
    for j, (lo, hi) in enumerate(bins):
        np.testing.assert_array_equal(t[k == j], np.arange(lo, hi + 1))  # bin_of inverts timestep_bins


def test_seed_repo_mistake_is_gone() -> None:
    """(0,100),(101,200),.. with an exclusive top never sampled 100, 200, ..: here every bin is 100 values wide."""
    assert timestep_bins(10) == [(100 * k, 100 * k + 99) for k in range(10)]
    assert bin_of(np.array([0, 99, 100, 199, 200, 999]), 10).tolist() == [0, 0, 1, 1, 2, 9]
    assert timestep_bins(3) == [(0, 332), (333, 665), (666, 999)]
    assert timestep_bins(1) == [(0, 999)] and timestep_bins(1000)[-1] == (999, 999)


@pytest.mark.parametrize("K", [0, -1, 1001])
def test_bin_count_out_of_range(K: int) -> None:
    with pytest.raises(ValueError, match="between 1 and 1000"):
        timestep_bins(K)


@pytest.mark.parametrize("t", [[-1], [1000], [5, 1000]])
def test_timesteps_out_of_range(t) -> None:
    with pytest.raises(ValueError, match="0..999"):
        bin_of(np.array(t), 10)
    assert bin_of(np.array([], dtype=np.int64), 10).size == 0
