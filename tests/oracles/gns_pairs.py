"""The adaLN-gradient GNS sums of analysis.core.gns_pairs in plain numpy: the per-example gradients' Gram matrix of
rank-one linears and a micro-batch's four sums per bin, as trainables.gns_adaln forms them in torch; the inputs the
tests feed the product's estimators."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray


def rank_one_gram(xs: Sequence[ArrayLike], deltas: Sequence[ArrayLike]) -> NDArray[np.float64]:
    """``(n, n)`` float64 Gram matrix ``g_i . g_j`` of the per-example gradients of linears ``y = W x + b``.

    ``xs[l]`` is linear ``l``'s input ``(n, D_l)``, ``deltas[l]`` the gradient of each example's own loss with
    respect to its output ``(n, O_l)``: ``sum_l (Delta_l Delta_l^T) * (X_l X_l^T + 1)``."""
    if len(xs) != len(deltas) or not xs:
        raise ValueError("need one delta per input, and at least one linear")
    gram = None
    for x, d in zip(xs, deltas, strict=True):
        x64, d64 = np.asarray(x, dtype=np.float64), np.asarray(d, dtype=np.float64)
        term = (d64 @ d64.T) * (x64 @ x64.T + 1.0)
        gram = term if gram is None else gram + term
    return gram


def pair_sums(gram: ArrayLike, bins: ArrayLike, num_bins: int) -> NDArray[np.float64]:
    """``(num_bins + 1, 4)`` float64 sums ``[pair-product sum, pair count, sum |g_i|^2, examples]`` of one micro-batch:
    row ``k`` over the examples of bin ``k`` (``bins[i]`` in ``0..num_bins-1``), the last row over all examples.
    Ordered pairs (``i != j`` both ways), so the count of a group of ``m`` is ``m (m - 1)``."""
    g = np.asarray(gram, dtype=np.float64)
    b = np.asarray(bins, dtype=np.int64)
    n = b.size
    if g.shape != (n, n):
        raise ValueError(f"gram must be ({n}, {n}) for {n} examples, got {g.shape}")
    if n and (b.min() < 0 or b.max() >= num_bins):
        raise ValueError(f"bins must lie in 0..{num_bins - 1}")
    onehot = np.zeros((n, num_bins), dtype=np.float64)
    onehot[np.arange(n), b] = 1.0
    diag = np.diag(g)
    out = np.zeros((num_bins + 1, 4), dtype=np.float64)
    counts = onehot.sum(0)
    out[:num_bins, 0] = ((g @ onehot) * onehot).sum(0) - onehot.T @ diag
    out[:num_bins, 1] = counts * (counts - 1.0)
    out[:num_bins, 2] = onehot.T @ diag
    out[:num_bins, 3] = counts
    out[num_bins] = [g.sum() - diag.sum(), n * (n - 1.0), diag.sum(), float(n)]
    return out
