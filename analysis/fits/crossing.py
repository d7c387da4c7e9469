"""Where a trial's loss curve crosses a target, from its noisy evaluations: a local quadratic fit.

The first passage (:func:`analysis.fits.steps.steps_to_target`: the first evaluation at or below the target,
interpolated linearly from the one before) is early by noise at small batch sizes and late by curvature at large
ones, both biasing ``B_crit`` low (docs/design.md). Here ``loss ≈ c0 + c1·x + c2·x²`` with ``x = log(step/s0)`` is
fitted by least squares to the evaluations around the first passage ``s0`` (within ``±WINDOW`` in log step, at least
``MIN_POINTS`` of the nearest; step 0 left out) and solved for the target: the root where the fitted curve descends,
within the window's range. Where there is none (no descent through the target there, too few evaluations, a
crossing at the first evaluation) the first passage stands. Exact for a curve quadratic in log step; tested against
float64 curves with known crossings in tests/analysis/test_crossing.py."""

from __future__ import annotations

import numpy as np

WINDOW = 0.25  # half-width of the fit's window around the first passage, in log step (+28% / -22% of the step)
MIN_POINTS = 6  # evaluations the fit takes at least (the nearest ones), as analysis.fits.steps.crossing_jitter


def refine(steps: np.ndarray, vals: np.ndarray, first: np.ndarray, target: float) -> np.ndarray:
    """The fitted crossing of ``target`` for each row of a padded (rows, evaluations) grid.

    ``steps``/``vals``: the evaluations of each trial in step order (padding: ``vals`` NaN); ``first``: (rows,) the
    first-passage crossing of each row (finite, > 0 where a refinement is wanted). Returns (rows,) crossings; a row
    whose fit gives no descending root in its window keeps ``first``."""
    steps = np.asarray(steps, dtype=np.float64)
    vals = np.asarray(vals, dtype=np.float64)
    first = np.asarray(first, dtype=np.float64)
    out = first.copy()
    ok_row = np.isfinite(first) & (first > 0)
    if not ok_row.any() or steps.shape[1] < 3:
        return out
    s, v, s0 = steps[ok_row], vals[ok_row], first[ok_row]
    valid = np.isfinite(v) & (s > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(valid, np.log(np.where(s > 0, s, 1.0) / s0[:, None]), np.nan)
    dist = np.where(valid, np.abs(x), np.inf)
    k = min(MIN_POINTS, dist.shape[1]) - 1
    radius = np.maximum(WINDOW, np.partition(dist, k, axis=1)[:, k])
    use = valid & (dist <= radius[:, None])
    enough = use.sum(axis=1) >= 4  # a quadratic with one degree of freedom to spare
    xw = np.where(use, x, 0.0)
    vw = np.where(use, v, 0.0)
    w = use.astype(np.float64)
    mom = [(w * xw**p).sum(axis=1) for p in range(5)]
    a = np.stack(
        [np.stack([mom[0], mom[1], mom[2]], -1), np.stack([mom[1], mom[2], mom[3]], -1),
         np.stack([mom[2], mom[3], mom[4]], -1)], -2,
    )  # fmt: skip
    rhs = np.stack([(w * vw).sum(axis=1), (w * vw * xw).sum(axis=1), (w * vw * xw**2).sum(axis=1)], -1)
    det = np.linalg.det(a)
    with np.errstate(divide="ignore", invalid="ignore"):
        solvable = enough & (np.abs(det) > 1e-10 * mom[0] * mom[2] * mom[4])  # distinct x: a well-posed fit
    coef = np.full((len(s0), 3), np.nan)
    if solvable.any():
        coef[solvable] = np.linalg.solve(a[solvable], rhs[solvable][..., None])[..., 0]
    lo = np.where(use, x, np.inf).min(axis=1)
    hi = np.where(use, x, -np.inf).max(axis=1)
    root = _descending_root(coef[:, 0] - target, coef[:, 1], coef[:, 2], lo, hi)
    good = solvable & np.isfinite(root)
    refined = s0.copy()
    refined[good] = s0[good] * np.exp(root[good])
    out[ok_row] = refined
    return out


def _descending_root(c0: np.ndarray, c1: np.ndarray, c2: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per row, the root of ``c0 + c1·x + c2·x² = 0`` in ``[lo, hi]`` where the curve descends (``c1 + 2·c2·x < 0``);
    ``nan`` where there is none. A quadratic descends through at most one of its roots, so there is no choice."""
    with np.errstate(divide="ignore", invalid="ignore"):
        disc = c1 * c1 - 4 * c2 * c0
        sq = np.sqrt(np.where(disc >= 0, disc, np.nan))
        quad = np.abs(c2) > 1e-12 * np.maximum(np.abs(c1), 1e-300)
        # the numerically stable pair of roots; a (near-)straight line has the one root -c0/c1
        qq = -0.5 * (c1 + np.copysign(sq, c1))
        r1 = np.where(quad, qq / c2, -c0 / c1)
        r2 = np.where(quad, c0 / qq, np.nan)
    best = np.full(len(c0), np.nan)
    for r in (r1, r2):
        ok = np.isfinite(r) & (r >= lo) & (r <= hi) & (c1 + 2 * c2 * r < 0)
        best = np.where(ok, r, best)
    return best
