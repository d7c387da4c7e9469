"""How far each batch size's best grid learning rate may sit from its optimum, and what that does to B_crit: the
check behind the ``coarse_lr_grid`` flag (:mod:`analysis.fits.flags`).

A batch size's fitted point is its best *grid* setting. When the grid is coarse, the optimum lies between grid points
and the point is slower than at the optimum by an amount that changes with B (the optimum moves with B): a systematic
bend of the points that neither the seeds nor the interval hold (``quiet3`` of ``tests/analysis/synth_shapes.py``:
3 learning rates an octave apart, the largest diverging from B = 512, the optimum moving towards it: B_crit 13% low,
coverage of the 90% interval 0.43). Measured from the sweep's own data:

1. **Curvature** shared by the batch sizes: ``S = C (1 + kappa (x - x_v)²)`` in ``x = log lr`` (a parabola in steps,
   the steps penalty relative to the optimum's), ``kappa`` the median over the batch sizes whose best setting has
   known neighbours on both sides of the parabola through those three. Shared, because one batch size's three points
   locate its vertex but estimate its curvature poorly, and a batch size with one known neighbour needs it. A
   parabola in log steps extrapolated the one-sided case (a diverged neighbour) 3x short in a worked ``quiet3`` case
   (``synth_sweeps``' penalty is this one).
2. **Vertex** per batch size: that curve least-squares fitted in log steps through the best setting and its known
   neighbours in lr (one or two; brute force over the vertex, :func:`vertex_fit`), the vertex clipped to the
   *bracket*: between the tried learning rates on either side of the best (a diverged, failed or censored neighbour
   bounds the optimum but gives no point; with none tried on a side the bracket ends at the best, which
   ``lr_at_edge`` flags). The *gap* ``log S_best - log C >= 0`` is what the batch size would gain at its optimum.
3. **Sensitivity**: ``b_crit_lr_opt``, B_crit refitted through the points lowered by their gaps. The grid is too
   coarse for this target when that moves B_crit by more than :data:`analysis.fits.flags.COARSE_LR_FRAC` of the
   interval's distance from B_crit on that side (:func:`exceeds`), or when some batch size's fitted vertex lies
   beyond a tried neighbour that gave no point (the optimum is where the grid could not measure it).

Nothing is judged without a curvature (no batch size with both neighbours known), and the sensitivity not without an
interval (``--bootstrap 0``).
"""

from __future__ import annotations

import numpy as np

from analysis.fits.steps import BestPerBatch, Settings

VERTEX_GRID = 401  # vertices tried per stage of the brute force (2 stages: 1/20000 of the bracket's width)


def _neighbours(tried: np.ndarray, lr: float) -> tuple[float | None, float | None]:
    """The tried learning rates just below and just above ``lr`` (None where none was tried on that side)."""
    below, above = tried[tried < lr * (1 - 1e-9)], tried[tried > lr * (1 + 1e-9)]
    return (float(below.max()) if len(below) else None, float(above.min()) if len(above) else None)


def _known(value: np.ndarray, st: Settings, b: int, lr: float | None) -> float | None:
    """The setting's steps at batch size ``b`` and learning rate ``lr`` if usable and finite, else None."""
    if lr is None:
        return None
    k = np.flatnonzero((st.batch_size == b) & np.isclose(st.lr, lr, rtol=1e-9, atol=0.0))
    return float(value[k[0]]) if len(k) == 1 and np.isfinite(value[k[0]]) else None


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
    """``kappa`` of the parabola ``S = C (1 + kappa (x - x_v)²)`` through three points ``(x, S)`` (``nan`` unless
    convex)."""
    a, b, c = np.polyfit(x, s, 2)
    return float(a / (c - b * b / (4 * a))) if a > 0 and c - b * b / (4 * a) > 0 else float("nan")


def shared_curvature(br: list) -> float:
    """Median ``kappa`` over the batch sizes whose best setting has both neighbours known (``nan`` where none has, or
    none is convex)."""
    k = [relative_curvature(x, np.exp(y)) for x, y, *_ in (p for p in br if p is not None) if len(x) == 3]
    k = [v for v in k if np.isfinite(v)]
    return float(np.median(k)) if k else float("nan")


def _sse(x: np.ndarray, y: np.ndarray, xs: np.ndarray, kappa: float) -> np.ndarray:
    """Residual sum of squares of ``log S = c + log(1 + kappa (x - x_v)²)`` at each vertex ``xs``, ``c`` fitted."""
    r = y[None, :] - np.log1p(kappa * (x[None, :] - xs[:, None]) ** 2)
    return ((r - r.mean(1, keepdims=True)) ** 2).sum(1)


def vertex_fit(x: np.ndarray, y: np.ndarray, lo: float, hi: float, kappa: float, n: int = VERTEX_GRID):
    """``(gap, x_v)`` for ``log S = c + log(1 + kappa (x - x_v)²)`` least-squares fitted through the points ``(x, y)``
    (log lr, log steps; best first) by brute force: ``n`` vertices spanning the bracket ``[lo, hi]`` widened by its
    width on each side, then ``n`` within one step of the best of them. ``gap = y_best - c >= 0`` with ``c`` refitted
    at ``x_v`` clipped to the bracket (the fit whose vertex the grid allows: the constrained least squares where the
    sum of squares does not rise again between the clip and ``x_v``, as with the best first and at most one
    neighbour on each side). ``x_v`` itself is returned unclipped. ``(0, x_best)`` with the best alone (no slope to
    read)."""
    if len(x) < 2 or not kappa > 0:
        return 0.0, float(x[0])
    w = max(hi - lo, 1e-12)
    xs = np.linspace(lo - w, hi + w, n)
    k = int(np.argmin(_sse(x, y, xs, kappa)))
    fine = np.linspace(xs[max(k - 1, 0)], xs[min(k + 1, n - 1)], n)
    xv = float(fine[int(np.argmin(_sse(x, y, fine, kappa)))])
    c = float(np.mean(y - np.log1p(kappa * (x - np.clip(xv, lo, hi)) ** 2)))  # the fit with its vertex in the bracket
    return max(0.0, float(y[0]) - c), xv


def vertex_gaps(value: np.ndarray, st: Settings, best: BestPerBatch, tried: dict[int, np.ndarray]):
    """``(gaps, beyond, kappa)``: per batch size the log steps its best setting loses to its interpolated optimum (0
    where not judged; ``nan`` where it has no point), whether that optimum lies beyond a tried neighbour that gave no
    point (diverged, failed or censored), and the shared curvature (module docstring, steps 1-2)."""
    br = brackets(value, st, best, tried)
    kappa = shared_curvature(br)
    gaps = np.where(np.isfinite(best.steps), 0.0, np.nan)
    beyond = np.zeros(len(gaps), dtype=bool)
    if np.isfinite(kappa):
        for i, p in enumerate(br):
            if p is not None:
                x, y, lo, hi = p
                gaps[i], xv = vertex_fit(x, y, lo, hi, kappa)
                beyond[i] = (xv > hi > x[0] and not np.isclose(x, hi).any()) or (
                    xv < lo < x[0] and not np.isclose(x, lo).any()
                )
    return gaps, beyond, kappa


def exceeds(b_crit: float, b_alt: float, ci: tuple[float, float], frac: float) -> bool:
    """Whether ``b_alt`` lies beyond ``frac`` of the interval's distance from ``b_crit`` on its side (in log B);
    False without an interval."""
    lo, hi = ci
    if not (np.isfinite(lo) and np.isfinite(hi) and np.isfinite(b_alt)) or lo <= 0:
        return False
    room = np.log(hi / b_crit) if b_alt >= b_crit else np.log(b_crit / lo)
    return bool(abs(np.log(b_alt / b_crit)) > frac * max(room, 0.0))
