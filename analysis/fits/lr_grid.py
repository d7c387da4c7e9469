"""Whether a batch size's best learning rate sits just below divergence while its optimum lies past it: the check
behind the ``lr_at_divergence`` flag (:mod:`analysis.fits.flags`).

``lr_at_edge`` catches a best lr at the end of what was tried, but a diverged trial counts as tried. When the steps
still fall towards a diverged neighbour, the optimum lies between the two, where the grid measured nothing, and the
point is slower than at its optimum by an amount that grows with B (the optimum moves up with B): B_crit comes out
low. From the sweep's own data: a **curvature** ``kappa`` of ``S = C (1 + kappa (x - x_v)²)`` in ``x = log lr``
shared by the batch sizes (the median over those with known neighbours on both sides; else the metric's median over
its targets; nothing is judged without one), then per batch size whose best setting has a diverged neighbour the
**vertex** fitted through the best and its known neighbour (:func:`vertex_fit`). The *gap* ``log S_best - log C`` is
what the batch size would gain at its optimum (:func:`divergence_gaps`); the point is flagged when it exceeds
:data:`analysis.fits.flags.LR_DIVERGENCE_GAP` and :data:`analysis.fits.flags.LR_DIVERGENCE_FRAC` of the interval's
log half-width. Why shared, and the simpler rules this replaced: docs/design.md."""

from __future__ import annotations

import numpy as np

from analysis.fits.steps import BestPerBatch, Settings

VERTEX_GRID = 401  # vertices tried per stage of the brute force ...
VERTEX_STAGES = 2  # ... the second within one step of the first's best: 1/20000 of the bracket's width apart


def _neighbours(tried: np.ndarray, lr: float) -> tuple[float | None, float | None]:
    """The tried learning rates just below and just above ``lr`` (None where none was tried on that side)."""
    below, above = tried[tried < lr * (1 - 1e-9)], tried[tried > lr * (1 + 1e-9)]
    return (float(below.max()) if len(below) else None, float(above.min()) if len(above) else None)


def _setting(st: Settings, b: int, lr: float | None) -> int | None:
    """The index of the setting at batch size ``b`` and learning rate ``lr`` (None where there is not exactly one)."""
    if lr is None:
        return None
    k = np.flatnonzero((st.batch_size == b) & np.isclose(st.lr, lr, rtol=1e-9, atol=0.0))
    return int(k[0]) if len(k) == 1 else None


def _known(value: np.ndarray, st: Settings, b: int, lr: float | None) -> float | None:
    """The setting's steps at batch size ``b`` and learning rate ``lr`` if usable and finite, else None."""
    k = _setting(st, b, lr)
    return float(value[k]) if k is not None and np.isfinite(value[k]) else None


def brackets(value: np.ndarray, st: Settings, best: BestPerBatch, tried: dict[int, np.ndarray]) -> list:
    """Per batch size: ``None`` where it is not judged (no point, or settings that differ in more than lr), else
    ``(x, y, lo, hi)``: log lr and log steps of the best setting and its known neighbours (best first), and the log
    lrs that bound the optimum. ``tried``: per batch size every learning rate tried there, diverged trials
    included."""
    out = []
    for i, b in enumerate(best.batch_sizes):
        if not np.isfinite(best.steps[i]) or not st.lr_only[i]:
            out.append(None)
            continue
        lr = float(st.lr[best.setting[i]])
        lo, hi = _neighbours(tried[int(b)], lr)
        pts = [(lr, float(best.steps[i]))] + [
            (q, s) for q in (lo, hi) if (s := _known(value, st, int(b), q)) is not None
        ]
        x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
        out.append((x, y, np.log(lo if lo is not None else lr), np.log(hi if hi is not None else lr)))
    return out


def relative_curvature(x: np.ndarray, s: np.ndarray) -> float:
    """``kappa`` of the parabola ``S = C (1 + kappa (x - x_v)²)`` through three points ``(x, S)``: ``kappa = a /
    S_min`` of ``S = a x² + b x + c`` (divided differences), ``S_min = c - b²/(4a)``; ``nan`` unless convex (``a > 0``
    and ``S_min > 0``)."""
    x0, x1, x2 = (float(v) for v in x)
    s0, s1, s2 = np.asarray(s, np.float64)
    d01, d12 = (s1 - s0) / (x1 - x0), (s2 - s1) / (x2 - x1)
    a = (d12 - d01) / (x2 - x0)
    b = d01 - a * (x0 + x1)
    c = s0 - a * x0 * x0 - b * x0
    with np.errstate(divide="ignore", invalid="ignore"):
        s_min = c - b * b / (4 * a)
        return float(a / s_min) if a > 0 and s_min > 0 else float("nan")


def shared_curvature(br: list) -> float:
    """Median ``kappa`` over the batch sizes whose best setting has both neighbours known (``nan`` where none has, or
    none is convex)."""
    k = [relative_curvature(x, np.exp(y)) for x, y, *_ in (p for p in br if p is not None) if len(x) == 3]
    k = [v for v in k if np.isfinite(v)]
    return float(np.median(k)) if k else float("nan")


def _sse(x: np.ndarray, y: np.ndarray, xs: np.ndarray, kappa: float) -> np.ndarray:
    """(n,) residual sums of squares of ``log S = c + log(1 + kappa (x - x_v)²)`` at the vertices ``xs`` (n,), ``c``
    fitted; ``x``, ``y`` (P,). ``Σ r² - (Σ r)²/P``, one point at a time."""
    s1 = np.zeros(xs.shape)
    s2 = np.zeros_like(s1)
    for p in range(len(x)):
        r = y[p] - np.log1p(kappa * (x[p] - xs) ** 2)
        s1 += r
        s2 += r * r
    return s2 - s1 * s1 / len(x)


def vertex_fit(x: np.ndarray, y: np.ndarray, lo: float, hi: float, kappa: float) -> tuple[float, float]:
    """``(gap, x_v)`` for ``log S = c + log(1 + kappa (x - x_v)²)`` least-squares fitted through the points ``(x, y)``
    (log lr, log steps; best first) by brute force: :data:`VERTEX_GRID` vertices spanning the bracket ``[lo, hi]``
    widened by its width on each side, then as many within one step of the best of them, :data:`VERTEX_STAGES`
    times. ``gap = y_best - c >= 0`` with ``c`` refitted at ``x_v`` clipped to the bracket (the fit whose vertex the
    grid allows: the constrained least squares where the sum of squares does not rise again between the clip and
    ``x_v``, as with the best first and at most one neighbour on each side). ``x_v`` itself is returned unclipped.
    ``(0, x_best)`` with the best alone (no slope to read) or ``kappa`` not positive."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) < 2 or not kappa > 0:
        return 0.0, float(x[0])
    n, w = VERTEX_GRID, max(hi - lo, 1e-12)
    xs = np.linspace(lo - w, hi + w, n)
    for _ in range(VERTEX_STAGES - 1):
        j = int(np.argmin(_sse(x, y, xs, kappa)))
        xs = np.linspace(xs[max(j - 1, 0)], xs[min(j + 1, n - 1)], n)
    v = float(xs[np.argmin(_sse(x, y, xs, kappa))])
    c = np.mean(y - np.log1p(kappa * (x - np.clip(v, lo, hi)) ** 2))
    return float(np.maximum(0.0, y[0] - c)), v


def refined_optima(
    value: np.ndarray, st: Settings, best: BestPerBatch, tried: dict[int, np.ndarray], kappa: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per batch size, ``(steps, lr)`` at the optimum interpolated between the grid's learning rates: ``log S = c +
    log(1 + kappa (x - x_v)²)`` fitted through the best setting and its known neighbours with the curvature
    ``kappa`` the batch sizes share (:func:`vertex_fit`; the vertex kept between the tried lrs that bound it, so an
    optimum beyond the grid's edge stays at the edge), ``exp(c)`` there. The plain minimum where it is not judged
    (no point, settings that differ in more than lr, no neighbour known, no shared curvature). Every batch size with
    a known neighbour is refined the same way, so the refined points share one model: a parabola through three
    points of each batch size alone leaves the edges and the diverged neighbours' batch sizes unrefined, and the
    mixture tilts ``B_crit`` (docs/design.md)."""
    steps = best.steps.copy()
    lr = np.where(best.setting >= 0, st.lr[np.maximum(best.setting, 0)], np.nan)
    if not np.isfinite(kappa):
        return steps, lr
    for i, br in enumerate(brackets(value, st, best, tried)):
        if br is None or len(br[0]) < 2:
            continue
        x, y, lo, hi = br
        gap, xv = vertex_fit(x, y, lo, hi, kappa)
        steps[i], lr[i] = float(np.exp(y[0] - gap)), float(np.exp(np.clip(xv, lo, hi)))
    return steps, lr


def divergence_gaps(
    value: np.ndarray,
    lower: np.ndarray,
    st: Settings,
    best: BestPerBatch,
    tried: dict[int, np.ndarray],
    diverged: dict[int, np.ndarray],
    kappa: float,
) -> np.ndarray:
    """Per batch size: the log steps its best setting loses to its interpolated optimum where that optimum lies
    between the best lr and a neighbour at which every trial diverged (module docstring, step 2); 0 where it does not
    (or is not judged), ``nan`` where the batch size has no point. ``value``, ``lower``: per setting, the seeds' mean
    steps and its lower bound (:func:`analysis.fits.steps.aggregate_seeds`); the neighbour on the other side enters
    with its steps, or, where a seed of it stopped short of the target, its lower bound: the fitted optimum then lies
    at least that far towards the diverged lr, and the gap is a lower bound. ``tried``: per batch size every learning
    rate tried there, diverged trials included; ``diverged``: those at which every trial diverged; ``kappa``: the
    shared curvature (:func:`shared_curvature` of these points, or the metric's where they give none)."""
    gaps = np.where(np.isfinite(best.steps), 0.0, np.nan)
    if not np.isfinite(kappa):
        return gaps
    for i, b in enumerate(best.batch_sizes):
        if not np.isfinite(best.steps[i]) or not st.lr_only[i]:
            continue
        lr = float(st.lr[best.setting[i]])
        below, above = _neighbours(tried[int(b)], lr)
        bad = diverged.get(int(b), np.zeros(0))
        for far, near in ((above, below), (below, above)):  # far: the diverged side; near: the other neighbour
            if far is None or near is None or not np.isclose(bad, far, rtol=1e-9, atol=0.0).any():
                continue
            k = _setting(st, int(b), near)
            if k is None or not (np.isfinite(value[k]) or lower[k] > best.steps[i]):
                continue
            s_near = float(value[k]) if np.isfinite(value[k]) else float(lower[k])  # its steps, or their lower bound
            x = np.log([lr, near])
            gap, xv = vertex_fit(x, np.log([best.steps[i], s_near]), *sorted((np.log(near), np.log(far))), kappa)
            if (xv - x[0]) * (np.log(far) - x[0]) > 0:  # the optimum is on the diverged side of the best
                gaps[i] = gap
    return gaps
