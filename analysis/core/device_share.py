"""A worker's share of one device (``scientific.gpus_per_worker``, ``bcrit recommend --gpus-per-worker``): a number in
(0, 1]. Ray places fractional GPUs, so several one-worker trials share a device; above 1 a DDP worker would hold GPUs
it cannot use. One definition for the sweep spec, the recommend command and its library function."""

from __future__ import annotations

import math
import numbers
from typing import Any


def share_error(name: str, value: Any) -> str | None:
    """The one-line error for ``value`` given as ``name`` where it is not a share of one device; None where it is."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= 1
    if ok:
        return None
    return f"{name} must be a share of one device in (0, 1], got {value!r}; e.g. 0.25: four one-worker trials per GPU"
