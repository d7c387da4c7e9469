"""A worker's share of one device (analysis.core.device_share): the one range check of the spec key, the recommend
flag and the library function."""

import math

import numpy as np
import pytest

from analysis.core.device_share import share_error


@pytest.mark.parametrize("v", [1, 1.0, 0.25, 1e-6, np.float32(0.5), np.float64(1.0)])
def test_a_share_in_the_half_open_unit_interval_passes(v):
    assert share_error("x", v) is None


@pytest.mark.parametrize("v", [0, 0.0, -0.5, 1.0000001, 2, math.nan, math.inf, True, False, "0.5", None])
def test_anything_else_is_named_with_the_range_and_an_example(v):
    why = share_error("scientific.gpus_per_worker", v)
    assert why == (
        f"scientific.gpus_per_worker must be a share of one device in (0, 1], got {v!r}; e.g. 0.25: four one-worker "
        "trials per GPU"
    )
