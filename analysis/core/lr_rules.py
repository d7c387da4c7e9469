"""How a learning rate follows a batch size ``k·B0``: the rules a batch-size schedule (``analysis.core.stages``)
and a branched study's branches (``analysis.features.branched.branched``) share."""

from __future__ import annotations

import math

LR_RULES = ("sqrt", "linear", "constant")  # lr = lr0 · sqrt(k) | lr0 · k | lr0


def lr_factor(rule: str, k: float) -> float:
    """Learning-rate multiplier of a branch at ``k·B0``: ``sqrt`` (Adam; Merrill et al.), ``linear`` (SGD),
    ``constant``."""
    if rule == "sqrt":
        return math.sqrt(k)
    if rule == "linear":
        return float(k)
    if rule == "constant":
        return 1.0
    raise ValueError(f"unknown lr rule {rule!r}; choose one of {list(LR_RULES)}")
