"""Gradient noise scale (GNS) estimators: pure functions over numbers and numpy arrays (no torch, no ray).

McCandlish et al. 2018 (arXiv 1812.06162, App. A.1): ``E[|G_b|^2] = |G|^2 + tr(Sigma) / b``, so two batch sizes
``b < B`` (same parameters, iid examples) give the unbiased estimators

    |G|^2     ~= (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr(Sigma) ~= (|G_b|^2 - |G_B|^2) / (1/b - 1/B)      (the paper's S)

and ``B_simple = tr(Sigma) / |G|^2``. The ratio of unbiased estimates is not unbiased, so B_simple is formed from
numerator and denominator averaged *separately*, then divided: over the last ``window`` optimizer steps
(``GNSWindow``, ``window_b_simple``: one rule for the live, per-bin, re-smoothed and reported values), or over
independent repetitions (``b_simple_with_se``, the probe), with a delta-method standard error. ``g2_small`` is
``|G_b|^2`` (or the mean over a step's small batches: same expectation), ``g2_big`` is ``|G_B|^2``. Negative
single-step ``|G|^2`` estimates are kept, never dropped (dropping them biases the mean upwards; docs/design.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analysis.core.metrics import gns_names

__all__ = [
    "DEFAULT_WINDOW",
    "GNSWindow",
    "WindowEstimate",
    "b_simple",
    "b_simple_with_se",
    "from_subbatch_grads",
    "g2_unbiased",
    "live_metrics",
    "mean_with_se",
    "trace_unbiased",
    "window_b_simple",
    "window_span",
    "window_estimate",
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
    (``GNSWindow``, ``window_b_simple``, ``b_simple_with_se``). ``nan`` where ``g2 == 0``.
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


DEFAULT_WINDOW = 100  # optimizer steps: the time constant of every live and offline B_simple (config gns_window)


def window_span(step: ArrayLike, window: int, half: bool = False) -> NDArray[np.int64]:
    """How far back the B_simple window reaches at optimizer ``step``: it holds the measurements at steps in
    ``(step - span, step]``. ``span = window``; with ``half`` (config ``gns_window_half``) at most ``ceil(step / 2)``
    too, i.e. never the first half of the steps so far: ``|G|^2`` falls by orders of magnitude during the first tens
    of steps, and a window reaching back to them in a short trial reads B_simple several times too low (the
    window means are dominated by the transient) with a wide SE. Long trials (``step >= 2 window``) are
    unaffected. The trial applies it to the global window only (per-bin measurements are too sparse)."""
    s = np.asarray(step, dtype=np.int64)
    return np.minimum(window, (s + 1) // 2) if half else np.full_like(s, window)


@dataclass(frozen=True)
class WindowEstimate:
    """B_simple of one window: ``value ± se`` from ``n`` measurements (``nan`` unless ``state == "ok"``)."""

    value: float
    se: float
    n: int  # measurements in the window
    state: str  # "ok", "warming" (fewer than 2 measurements) or "undefined" (mean |G|^2 <= 0, mean tr < 0, ...)

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def window_estimate(g2: ArrayLike, trace: ArrayLike) -> WindowEstimate:
    """The one smoothing rule's ratio: ``B_simple = mean(tr Sigma) / mean(|G|^2)`` over a window's measurements.

    ``g2`` and ``trace`` are the unbiased per-measurement estimates (``g2_unbiased``, ``trace_unbiased``) of every
    measurement in the window. The SE is the first-order delta method on the two window means with their
    covariance (``b_simple_with_se``): the measurements use disjoint iid examples, so within a window they are
    independent draws (up to the drift of the weights, which only widens the spread). Impossible values are
    never returned: a window mean ``|G|^2 <= 0`` (a ratio without a positive denominator), a negative mean
    ``tr(Sigma)`` or anything non-finite gives ``state == "undefined"`` and ``nan``; fewer than 2 measurements
    (no spread, so no SE) gives ``state == "warming"`` and ``nan``.
    """
    g = np.asarray(g2, dtype=np.float64).ravel()
    t = np.asarray(trace, dtype=np.float64).ravel()
    n = int(g.size)
    if n < 2:
        return WindowEstimate(math.nan, math.nan, n, "warming")
    with np.errstate(over="ignore", invalid="ignore"):
        g_mean, t_mean = float(g.mean()), float(t.mean())
    if not (math.isfinite(g_mean) and math.isfinite(t_mean) and g_mean > 0.0 and t_mean >= 0.0):
        return WindowEstimate(math.nan, math.nan, n, "undefined")
    with np.errstate(over="ignore", invalid="ignore"):
        value, se = b_simple_with_se(g, t)
    if not (math.isfinite(value) and math.isfinite(se) and value >= 0.0):  # overflow in the covariance
        return WindowEstimate(math.nan, math.nan, n, "undefined")
    return WindowEstimate(value, se, n, "ok")


def stratified_b_simple(g2_groups: list[ArrayLike], trace_groups: list[ArrayLike]) -> WindowEstimate:
    """B_simple over groups weighted equally: ``mean_p(mean tr_p) / mean_p(mean |G|^2_p)`` with a delta-method SE.

    Group ``p`` holds the unbiased per-measurement estimates of one stratum (at a target: one batch size's fitted
    trials in their windows at the crossing). Each group's means weigh the same however many measurements it has (a
    small batch size's trial measures over more steps). The SE is the sampling noise of the group means: the
    within-group (co)variance pooled over groups (``ddof`` = number of groups), divided by each group's size,

        Var(R) ~= (s_T^2 - 2 R s_TG + R^2 s_G^2) * sum_p(1 / n_p) / (P^2 G^2),

    so one group is exactly ``window_estimate``. It does not include the spread between the groups' own ratios (a
    real difference between batch sizes is not noise). States as ``window_estimate``: ``"warming"`` without two
    measurements in some group's worth of spread (total measurements <= number of groups), ``"undefined"`` for a
    mean ``|G|^2 <= 0``, a negative mean ``tr`` or anything non-finite.
    """
    gs = [np.asarray(g, dtype=np.float64).ravel() for g in g2_groups]
    ts = [np.asarray(t, dtype=np.float64).ravel() for t in trace_groups]
    if len(gs) != len(ts) or any(g.size != t.size for g, t in zip(gs, ts, strict=True)):
        raise ValueError("g2_groups and trace_groups must pair up group by group and sample by sample")
    keep = [i for i, g in enumerate(gs) if g.size > 0]
    gs, ts = [gs[i] for i in keep], [ts[i] for i in keep]
    n = int(sum(g.size for g in gs))
    if n <= len(gs):
        return WindowEstimate(math.nan, math.nan, n, "warming")
    with np.errstate(over="ignore", invalid="ignore"):
        g_means = np.array([g.mean() for g in gs])
        t_means = np.array([t.mean() for t in ts])
        g_mean, t_mean = float(g_means.mean()), float(t_means.mean())
        if not (math.isfinite(g_mean) and math.isfinite(t_mean) and g_mean > 0.0 and t_mean >= 0.0):
            return WindowEstimate(math.nan, math.nan, n, "undefined")
        rt = np.concatenate([t - m for t, m in zip(ts, t_means, strict=True)])
        rg = np.concatenate([g - m for g, m in zip(gs, g_means, strict=True)])
        dof = n - len(gs)
        s_tt, s_gg, s_tg = float(rt @ rt) / dof, float(rg @ rg) / dof, float(rt @ rg) / dof
        r = t_mean / g_mean
        scale = sum(1.0 / g.size for g in gs) / len(gs) ** 2
        var_r = (s_tt - 2.0 * r * s_tg + r * r * s_gg) * scale / (g_mean * g_mean)
    se = math.sqrt(max(var_r, 0.0))
    if not (math.isfinite(r) and math.isfinite(se) and r >= 0.0):
        return WindowEstimate(math.nan, math.nan, n, "undefined")
    return WindowEstimate(r, se, n, "ok")


class GNSWindow:
    """Live B_simple ± SE: means of ``tr(Sigma)`` and ``|G|^2`` over the last ``window`` optimizer steps, divided.

    The one rule for the global value, every per-bin value, the offline re-smoothing and the report: at step ``s`` the
    window holds every measurement taken at a step in ``(s - window, s]`` -- every step for the global statistics, every
    ``gns_every`` steps for a bin, so both forget a measurement at the same age in *steps*; with ``half`` it never
    reaches back past ``s - ceil(s / 2)`` either (``window_span``). ``window_estimate`` forms the ratio of the window
    means and its SE. A window, not an EMA: ``|G|^2`` falls by orders of magnitude in the first steps and an EMA
    remembers that transient forever, while a window forgets it exactly and its plain means give an honest SE, at a lag
    of about ``window / 2`` steps (docs/design.md)."""

    def __init__(self, window: int = DEFAULT_WINDOW, half: bool = False) -> None:
        if int(window) != window or window < 1:
            raise ValueError(f"window must be a positive number of optimizer steps, got {window!r}")
        self.window, self.half = int(window), bool(half)
        self._steps: list[int] = []
        self._g2: list[float] = []
        self._trace: list[float] = []
        self.undefined = 0  # updates at which the window gave no possible value (state "undefined")

    def update(self, step: int, g2_small: float, g2_big: float, b: float, B: float) -> WindowEstimate:
        """Add the raw two-batch statistics measured at optimizer ``step``; return the window's estimate.

        Non-finite statistics (an overflowed step) are not added; the window still moves to ``step``."""
        with np.errstate(over="ignore", invalid="ignore"):
            g2 = float(g2_unbiased(g2_small, g2_big, b, B))
            trace = float(trace_unbiased(g2_small, g2_big, b, B))
        self.add(step, g2, trace)
        est = self.estimate
        if est.state == "undefined":
            self.undefined += 1
        return est

    def add(self, step: int, g2: float, trace: float) -> None:
        """Add the unbiased ``|G|^2`` and ``tr(Sigma)`` of the measurement at ``step`` themselves (any estimator's:
        ``analysis.core.gns_pairs``) and move the window to ``step``, without forming the estimate (``update`` is
        this plus ``estimate`` and the undefined count). Non-finite ones (no measurement this step) are not added."""
        if self._steps and step <= self._steps[-1]:
            raise ValueError(f"GNS measurements must come in increasing steps, got {step} after {self._steps[-1]}")
        if math.isfinite(g2) and math.isfinite(trace):
            self._steps.append(int(step))
            self._g2.append(g2)
            self._trace.append(trace)
        cut, span = 0, min(self.window, (step + 1) // 2) if self.half else self.window  # window_span, for one step
        while cut < len(self._steps) and self._steps[cut] <= step - span:
            cut += 1
        del self._steps[:cut], self._g2[:cut], self._trace[:cut]

    @property
    def estimate(self) -> WindowEstimate:
        """``window_estimate`` of the measurements now in the window."""
        return window_estimate(self._g2, self._trace)

    def means(self) -> tuple[float, float]:
        """The window means ``(mean |G|^2, mean tr(Sigma))`` (``nan`` for an empty window)."""
        if not self._g2:
            return math.nan, math.nan
        return float(np.mean(self._g2)), float(np.mean(self._trace))

    def state_dict(self) -> dict[str, Any]:
        """Plain-python state for checkpoints (the window's measurements and the undefined count)."""
        return {
            "window": self.window,
            "steps": list(self._steps),
            "g2": list(self._g2),
            "trace": list(self._trace),
            "undefined": self.undefined,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from ``state_dict()``, keeping this object's ``window``. A checkpoint from before the window
        rule (an EMA state: ``steps`` is a count) has no measurements to restore: the window starts empty."""
        steps = state.get("steps")
        if not isinstance(steps, list | tuple):
            if "beta" not in state:
                raise ValueError(f"not a GNSWindow state (keys {sorted(state)})")
            self._steps, self._g2, self._trace, self.undefined = [], [], [], 0
            return
        g2, trace = list(state["g2"]), list(state["trace"])
        if not len(steps) == len(g2) == len(trace):
            raise ValueError("GNSWindow state: steps, g2 and trace differ in length")
        self._steps = [int(s) for s in steps]
        self._g2 = [float(x) for x in g2]
        self._trace = [float(x) for x in trace]
        self.undefined = int(state.get("undefined", 0))


def window_b_simple(
    step: ArrayLike,
    g2_small: ArrayLike,
    g2_big: ArrayLike,
    b: ArrayLike,
    B: ArrayLike,
    window: int,
    half: bool = False,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``GNSWindow`` over a logged series (offline re-smoothing): ``(B_simple, SE)`` after each measurement.

    ``step`` holds the optimizer steps of the measurements (strictly increasing); entry ``i`` applies
    ``window_estimate`` to the measurements at steps in ``(step[i] - span, step[i]]``, ``span = window_span(step[i],
    window, half)`` (``nan`` where not defined). Equal to feeding ``GNSWindow(window, half).update`` measurement by
    measurement.
    """
    if int(window) != window or window < 1:
        raise ValueError(f"window must be a positive number of optimizer steps, got {window!r}")
    g2, trace = _per_step(g2_small, g2_big, b, B)
    s = np.asarray(step, dtype=np.float64)
    if s.shape != g2.shape:
        raise ValueError(f"step has shape {s.shape}, the statistics {g2.shape}")
    if np.any(np.diff(s) <= 0):
        raise ValueError("steps must be strictly increasing")
    lo = np.searchsorted(s, s - window_span(s, int(window), half), side="right")
    value, se = np.full(s.size, np.nan), np.full(s.size, np.nan)
    for i in range(s.size):
        est = window_estimate(g2[lo[i] : i + 1], trace[lo[i] : i + 1])
        value[i], se[i] = est.value, est.se
    return value, se


def live_metrics(
    tracker: GNSWindow, step: int, g2_small: float, g2_big: float, b: float, B: float, k: int | None = None
) -> dict[str, float]:
    """What a trial logs for one GNS measurement at ``step``: raw statistics, per-step estimates, B_simple ± SE.

    Metric names are ``analysis.core.metrics.gns_names(k)`` (global for ``k=None``, else timestep bin ``k``).
    ``b_simple`` and ``b_simple_se`` appear only when the window's estimate is defined (so no
    negative or non-finite B_simple is ever logged); ``b_simple_undefined`` (the tracker's running count) only
    at an update that could not form one. Raw values are logged as measured, non-finite ones included.
    """
    names = gns_names(k)
    out = {names["g2_small"]: float(g2_small), names["g2_big"]: float(g2_big)}
    out[names["b_small"]], out[names["b_big"]] = float(b), float(B)
    with np.errstate(over="ignore", invalid="ignore"):
        out[names["g2"]] = float(g2_unbiased(g2_small, g2_big, b, B))
        out[names["trace"]] = float(trace_unbiased(g2_small, g2_big, b, B))
    est = tracker.update(step, g2_small, g2_big, b, B)
    if est.ok:
        out[names["b_simple"]], out[names["b_simple_se"]] = est.value, est.se
    elif est.state == "undefined":
        out[names["b_simple_undefined"]] = float(tracker.undefined)
    return out


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
