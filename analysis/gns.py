"""Gradient noise scale (GNS) estimators: pure functions over numbers and numpy arrays (no torch, no ray).

Reference: McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training",
arXiv 1812.06162, Appendix A.1 ("the two-batch estimators"). With true gradient ``G``, per-example
covariance ``Sigma`` and ``G_b`` the mean gradient of ``b`` iid examples,

    E[|G_b|^2] = |G|^2 + tr(Sigma) / b,

so two batch sizes ``b < B`` (same parameters, iid examples) give the unbiased estimators

    |G|^2     ~= (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr(Sigma) ~= (|G_b|^2 - |G_B|^2) / (1/b - 1/B)      (the paper's S)

and the simple noise scale ``B_simple = tr(Sigma) / |G|^2``. Each estimate is unbiased; their ratio is
not, so B_simple is formed from numerator and denominator smoothed *separately* (bias-corrected EMA for
live logging, trailing windowed means or repetition means for offline analysis), then divided.

Conventions: ``g2_small`` is ``|G_b|^2`` (the mean over the small-batch gradients of one step is fine:
it has the same expectation), ``g2_big`` is ``|G_B|^2``. Single-step ``|G|^2`` estimates are noisy and
may be negative; they are kept, never dropped (dropping them biases the mean upwards).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.signal import lfilter

__all__ = [
    "GNSEma",
    "b_simple",
    "b_simple_with_se",
    "ema_b_simple",
    "from_subbatch_grads",
    "g2_unbiased",
    "mean_with_se",
    "trace_unbiased",
    "windowed_b_simple",
]

Float = float | NDArray[np.float64]


def _out(x: NDArray[np.float64]) -> Float:
    """A 0-d result as a python float, anything else as a float64 array."""
    return float(x) if np.ndim(x) == 0 else x


def _sizes(b: ArrayLike, B: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Validate batch sizes: 1 <= b < B everywhere (after broadcasting)."""
    b_arr = np.asarray(b, dtype=np.float64)
    B_arr = np.asarray(B, dtype=np.float64)
    if not (np.all(np.isfinite(b_arr)) and np.all(np.isfinite(B_arr))):
        raise ValueError("batch sizes b and B must be finite")
    if np.any(b_arr < 1):
        raise ValueError(f"small batch size b must be >= 1, got {b!r}")
    if np.any(np.broadcast_to(b_arr >= B_arr, np.broadcast_shapes(b_arr.shape, B_arr.shape))):
        raise ValueError(f"need b < B for the two-batch estimators, got b={b!r}, B={B!r}")
    return b_arr, B_arr


def g2_unbiased(g2_small: ArrayLike, g2_big: ArrayLike, b: ArrayLike, B: ArrayLike) -> Float:
    """Unbiased ``|G|^2 = (B |G_B|^2 - b |G_b|^2) / (B - b)`` (McCandlish et al. 2018, App. A.1).

    Broadcasts scalars and arrays; raises ValueError unless ``1 <= b < B``. A single estimate is noisy
    and may be negative: keep it.
    """
    b_arr, B_arr = _sizes(b, B)
    small = np.asarray(g2_small, dtype=np.float64)
    big = np.asarray(g2_big, dtype=np.float64)
    return _out((B_arr * big - b_arr * small) / (B_arr - b_arr))


def trace_unbiased(g2_small: ArrayLike, g2_big: ArrayLike, b: ArrayLike, B: ArrayLike) -> Float:
    """Unbiased ``tr(Sigma) = (|G_b|^2 - |G_B|^2) / (1/b - 1/B)`` (McCandlish et al. 2018, App. A.1).

    Broadcasts scalars and arrays; raises ValueError unless ``1 <= b < B``.
    """
    b_arr, B_arr = _sizes(b, B)
    small = np.asarray(g2_small, dtype=np.float64)
    big = np.asarray(g2_big, dtype=np.float64)
    return _out((small - big) / (1.0 / b_arr - 1.0 / B_arr))


def b_simple(trace: ArrayLike, g2: ArrayLike) -> Float:
    """Simple noise scale ``B_simple = tr(Sigma) / |G|^2`` (McCandlish et al. 2018, Sec. 2.2).

    A plain ratio. Applied to single noisy draws it is biased (the ratio of unbiased estimates is not
    unbiased, and a denominator near zero explodes): smooth or average ``trace`` and ``g2`` first
    (``GNSEma``, ``windowed_b_simple``, ``b_simple_with_se``). ``nan`` where ``g2 == 0``.
    """
    t = np.asarray(trace, dtype=np.float64)
    g = np.asarray(g2, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(g == 0.0, np.nan, t / np.where(g == 0.0, 1.0, g))
    return _out(out)


def _finite_series(name: str, x: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values (skip steps whose gradients overflowed)")
    return arr


class GNSEma:
    """Live B_simple: bias-corrected EMAs of ``tr(Sigma)`` and ``|G|^2``, smoothed separately, then divided.

    McCandlish et al. 2018 (arXiv 1812.06162, App. A.1) smooth the two unbiased estimators with EMAs and
    take the ratio of the smoothed values. Bias correction (as in Adam) divides an EMA started at zero by
    ``1 - beta**n``; we keep the corrected means directly, with the equivalent update

        m_n = m_{n-1} + w_n (x_n - m_{n-1}),   w_n = (1 - beta) / (1 - beta**n),

    so the first update returns the first ratio exactly. The state is plain python numbers (it goes into
    training checkpoints). Non-finite inputs raise ValueError (skip overflowed AMP steps before calling).
    """

    def __init__(self, beta: float = 0.99) -> None:
        if not (0.0 <= beta < 1.0):
            raise ValueError(f"EMA beta must be in [0, 1), got {beta!r}")
        self.beta = float(beta)
        self.steps = 0
        self._g2 = math.nan  # bias-corrected EMA of |G|^2
        self._trace = math.nan  # bias-corrected EMA of tr(Sigma)

    def update(self, g2_small: float, g2_big: float, b: float, B: float) -> float:
        """Add one step's raw two-batch statistics; return the smoothed B_simple (nan until defined)."""
        g2 = float(g2_unbiased(g2_small, g2_big, b, B))
        trace = float(trace_unbiased(g2_small, g2_big, b, B))
        if not (math.isfinite(g2) and math.isfinite(trace)):
            raise ValueError(f"non-finite GNS statistics: g2_small={g2_small!r}, g2_big={g2_big!r}")
        self.steps += 1
        w = (1.0 - self.beta) / (1.0 - self.beta**self.steps)
        if self.steps == 1:
            self._g2, self._trace = g2, trace
        else:
            self._g2 += w * (g2 - self._g2)
            self._trace += w * (trace - self._trace)
        return self.b_simple

    @property
    def g2(self) -> float:
        """Bias-corrected EMA of the unbiased ``|G|^2`` estimates (nan before the first update)."""
        return self._g2

    @property
    def trace(self) -> float:
        """Bias-corrected EMA of the unbiased ``tr(Sigma)`` estimates (nan before the first update)."""
        return self._trace

    @property
    def b_simple(self) -> float:
        """``EMA(tr Sigma) / EMA(|G|^2)``; nan before the first update or while ``EMA(|G|^2) == 0``."""
        if self.steps == 0:
            return math.nan
        return float(b_simple(self._trace, self._g2))

    def state_dict(self) -> dict[str, Any]:
        """Plain-python state for checkpoints."""
        return {"beta": self.beta, "steps": self.steps, "g2": self._g2, "trace": self._trace}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from ``state_dict()``; raises ValueError on missing keys or a bad beta."""
        missing = {"beta", "steps", "g2", "trace"} - set(state)
        if missing:
            raise ValueError(f"GNSEma state is missing {sorted(missing)}")
        beta = float(state["beta"])
        if not (0.0 <= beta < 1.0):
            raise ValueError(f"EMA beta must be in [0, 1), got {beta!r}")
        steps = int(state["steps"])
        if steps < 0:
            raise ValueError(f"EMA steps must be >= 0, got {steps}")
        self.beta, self.steps = beta, steps
        self._g2, self._trace = float(state["g2"]), float(state["trace"])


def _per_step(
    g2_small: ArrayLike, g2_big: ArrayLike, b: ArrayLike, B: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per-step unbiased (|G|^2, tr Sigma) as 1-d float64 series; b and B broadcast against the series."""
    small = _finite_series("g2_small", g2_small)
    big = _finite_series("g2_big", g2_big)
    shape = np.broadcast_shapes(small.shape, big.shape, np.shape(b), np.shape(B))
    if len(shape) != 1:
        raise ValueError(f"expected 1-d series (one entry per step), got shape {shape}")
    g2 = np.broadcast_to(g2_unbiased(small, big, b, B), shape)
    trace = np.broadcast_to(trace_unbiased(small, big, b, B), shape)
    return np.asarray(g2, dtype=np.float64), np.asarray(trace, dtype=np.float64)


def ema_b_simple(
    g2_small: ArrayLike, g2_big: ArrayLike, b: ArrayLike, B: ArrayLike, beta: float = 0.99
) -> NDArray[np.float64]:
    """``GNSEma`` over a whole series (offline re-analysis): the B_simple it would report after each step.

    Vectorised with a linear filter (``ema_n = beta ema_{n-1} + (1-beta) x_n``, divided by ``1-beta**n``);
    equal to feeding ``GNSEma.update`` step by step up to rounding. McCandlish et al. 2018, App. A.1.
    """
    if not (0.0 <= beta < 1.0):
        raise ValueError(f"EMA beta must be in [0, 1), got {beta!r}")
    g2, trace = _per_step(g2_small, g2_big, b, B)
    n = np.arange(1, g2.size + 1, dtype=np.float64)
    correction = 1.0 - beta**n
    ema_g2 = lfilter([1.0 - beta], [1.0, -beta], g2) / correction
    ema_trace = lfilter([1.0 - beta], [1.0, -beta], trace) / correction
    return np.asarray(b_simple(ema_trace, ema_g2), dtype=np.float64).reshape(g2.shape)


def windowed_b_simple(
    g2_small: ArrayLike, g2_big: ArrayLike, b: ArrayLike, B: ArrayLike, window: int
) -> NDArray[np.float64]:
    """Trailing windowed means of ``tr(Sigma)`` and ``|G|^2`` separately, then their ratio (per step).

    Entry ``i`` uses steps ``max(0, i - window + 1) .. i``: the first ``window - 1`` entries average the
    steps available so far (a shorter window, not padding). McCandlish et al. 2018, App. A.1.
    """
    if int(window) != window or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    window = int(window)
    g2, trace = _per_step(g2_small, g2_big, b, B)

    def trailing_mean(x: NDArray[np.float64]) -> NDArray[np.float64]:
        c = np.concatenate([[0.0], np.cumsum(x)])
        hi = np.arange(1, x.size + 1)
        lo = np.maximum(hi - window, 0)
        return (c[hi] - c[lo]) / (hi - lo)

    return np.asarray(b_simple(trailing_mean(trace), trailing_mean(g2)), dtype=np.float64).reshape(g2.shape)


def mean_with_se(samples: ArrayLike) -> tuple[float, float]:
    """Mean of independent repeated estimates and its standard error ``std(ddof=1) / sqrt(n)``.

    Every sample is kept, negative ``|G|^2`` draws included (dropping them is a bias). Needs n >= 2.
    """
    x = np.asarray(samples, dtype=np.float64).ravel()
    if x.size < 2:
        raise ValueError(f"need at least 2 independent samples for a standard error, got {x.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError("samples contain non-finite values")
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))


def b_simple_with_se(g2_samples: ArrayLike, trace_samples: ArrayLike) -> tuple[float, float]:
    """``B_simple = mean(trace) / mean(g2)`` from repeated independent estimates, with a delta-method SE.

    Sample ``i`` of ``g2_samples`` and of ``trace_samples`` come from the same repetition (they are
    correlated; the covariance enters the SE). Ratio of means R = T/G, first-order delta method:

        Var(R) ~= (s_T^2 - 2 R s_TG + R^2 s_G^2) / (n G^2)

    with sample (co)variances ``ddof=1``. All draws are kept, negative ``|G|^2`` ones included
    (McCandlish et al. 2018, App. A.1: average numerator and denominator before dividing). Needs n >= 2.
    """
    g = np.asarray(g2_samples, dtype=np.float64).ravel()
    t = np.asarray(trace_samples, dtype=np.float64).ravel()
    if g.size != t.size:
        raise ValueError(f"g2_samples and trace_samples must pair up, got {g.size} and {t.size}")
    if g.size < 2:
        raise ValueError(f"need at least 2 independent repetitions for a standard error, got {g.size}")
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(t))):
        raise ValueError("samples contain non-finite values")
    n = g.size
    g_mean, t_mean = g.mean(), t.mean()
    if g_mean == 0.0:
        return math.nan, math.nan
    r = t_mean / g_mean
    cov = np.cov(np.stack([t, g]), ddof=1)  # [[s_T^2, s_TG], [s_TG, s_G^2]]
    var_r = (cov[0, 0] - 2.0 * r * cov[0, 1] + r * r * cov[1, 1]) / (n * g_mean * g_mean)
    return float(r), float(math.sqrt(max(var_r, 0.0)))


def from_subbatch_grads(grads: ArrayLike, sizes: ArrayLike) -> tuple[float, float, int, int]:
    """Two-batch statistics from ``m`` equal-size sub-batch mean gradients (rows of ``grads[m, P]``).

    Returns ``(g2_small, g2_big, b, B)``: ``g2_small`` is the mean of the ``m`` squared norms
    ``|G_b,i|^2`` (same expectation as one, less variance), ``g2_big = |mean_i G_b,i|^2``, ``b`` the
    common size and ``B = m b``. The sub-batches must hold disjoint iid examples. Unequal sizes raise:
    averaging unequal sub-batch means with equal weights gives a batch whose effective size is not
    their total (32+32+32+4 behaves like ~46, not 100). McCandlish et al. 2018, App. A.1.
    """
    g = np.asarray(grads, dtype=np.float64)
    s = np.asarray(sizes)
    if g.ndim != 2:
        raise ValueError(f"grads must be [m, P], got shape {g.shape}")
    m = g.shape[0]
    if m < 2:
        raise ValueError(f"need at least 2 sub-batches, got {m}")
    if s.shape != (m,):
        raise ValueError(f"sizes must have shape ({m},), got {s.shape}")
    if not np.all(s == s[0]) or int(s[0]) != s[0] or s[0] < 1:
        raise ValueError(
            f"sub-batch sizes must be equal positive integers, got {s.tolist()} "
            "(equal-weight averaging of unequal sub-batches has the wrong effective batch size)"
        )
    b = int(s[0])
    g2_small = float(np.mean(np.einsum("mp,mp->m", g, g)))
    big = g.mean(axis=0)
    return g2_small, float(big @ big), b, b * m
