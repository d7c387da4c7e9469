"""The refined B_crit's own bootstrap: the learning-rate refinement redone inside every replicate (issue 45).

``b_crit_refined`` (:func:`analysis.fits.lr_grid.refined_optima`) fits each batch size's optimum between the grid's
learning rates with the curvature the batch sizes share, where the plain fit takes the best *grid* setting. Its
error is centred where the plain fit's trusted targets lean (benchmarks/RESULTS.md, "The lean that is left"), but
the plain interval re-centred on it does not hold its misses evenly: the refined estimate varies with the best
setting's neighbours and with the curvature, which the plain replicates (the best setting's seeds only) do not
carry. So each replicate of :func:`analysis.fits.pareto.bootstrap_settings` (every setting's seeds redrawn) is
refined as the point estimate is:

1. its best setting per batch size re-taken (censoring-aware, as :func:`analysis.fits.pareto.best_of_settings`);
2. the shared curvature re-estimated from that replicate's three-point parabolas
   (:func:`analysis.fits.lr_grid.curvatures_batched`, the median over its batch sizes; the point estimate's where
   the replicate gives none);
3. every batch size with a known neighbour refined with it (:func:`analysis.fits.lr_grid.vertex_fit_batched`, the
   brute force of the point estimate, vectorised over the replicates).

The interval is then taken from these replicates as the plain one is from its own (lack of fit added, calibrated):
:func:`analysis.fits.sweep_fit._b_crit_interval`. Only where the interval resamples seeds: with one seed per
setting (``ci_resamples: trials``) the settings themselves are drawn, and a replicate's grid is not the sweep's.

Measured, and not the headline (``analyze_metric(..., refined_interval=True)`` only; benchmarks/RESULTS.md, "Misses
counted by sweep"): on 60 sweeps each of ``t3`` and ``new`` the refined interval is 0.57-0.70 of the plain one's
width while the refined estimate's error is only 0.9-1.0 of the plain one's spread, and it leans -1.1% on ``new``:
coverage 0.895 globally and 0.875 per bin there (plain: 0.969, 0.951), 0.965 and 0.924 on ``t3``.
"""

from __future__ import annotations

import warnings

import numpy as np

from analysis.fits.lr_grid import _neighbours, _setting, curvatures_batched, vertex_fit_batched
from analysis.fits.pareto import best_of_settings
from analysis.fits.steps import Settings


def _brackets(val: np.ndarray, st: Settings, plain: np.ndarray, tried: dict[int, np.ndarray]) -> list:
    """Per batch size, the replicates grouped by what their refinement sees: a list of ``(i, rows, cols, x, lo,
    hi)``: batch size index ``i``, the replicates ``rows`` whose best setting there is ``cols[0]`` and whose known
    neighbours (finite steps) are ``cols[1:]``; ``x``: those settings' log lrs; ``lo``, ``hi``: the log lrs that
    bound the optimum (as :func:`analysis.fits.lr_grid.brackets`). ``plain``: (R, n_b) the replicates' best steps
    (finite where the batch size has a point)."""
    out = []
    for i, b in enumerate(np.unique(st.batch_size)):
        if not st.lr_only[i]:
            continue
        idx = np.flatnonzero(st.batch_size == b)
        has = np.isfinite(plain[:, i])
        arg = idx[np.argmin(val[:, idx], axis=1)]
        for k in np.unique(arg[has]):
            lr = float(st.lr[k])
            lo, hi = _neighbours(tried[int(b)], lr)
            nbs = [(q, j) for q in (lo, hi) if (j := _setting(st, int(b), q)) is not None]
            if not nbs:  # no neighbour is a setting: nothing to refine with
                continue
            rows = np.flatnonzero(has & (arg == k))
            known = np.isfinite(val[rows][:, [j for _, j in nbs]])
            for pattern in np.unique(known, axis=0):
                sub = rows[(known == pattern).all(axis=1)]
                use = [nb for nb, on in zip(nbs, pattern, strict=True) if on]
                cols = np.array([k] + [j for _, j in use])
                x = np.log([lr] + [q for q, _ in use])
                bound = np.log([lo if lo is not None else lr, hi if hi is not None else lr])
                out.append((i, sub, cols, x, float(bound[0]), float(bound[1])))
    return out


def refined_replicates(
    val: np.ndarray,
    low: np.ndarray,
    st: Settings,
    tried: dict[int, np.ndarray],
    kappa: float,
    plain: np.ndarray | None = None,
) -> np.ndarray:
    """(R, n_b) each replicate's refined steps per batch size (module docstring, steps 1-3), from one target's
    replicated settings ``val``, ``low`` (R, n_settings) (:func:`analysis.fits.pareto.bootstrap_settings`).
    ``nan`` where the replicate's batch size is censored, ``inf`` where nothing reached; the plain best where the
    batch size is not refined (settings that differ in more than lr, no known neighbour, no curvature). ``kappa``:
    the point estimate's shared curvature, used where a replicate's own parabolas give none (``nan``: nothing is
    refined, as :func:`analysis.fits.lr_grid.refined_optima`). ``plain``: the replicates' best steps per batch size
    where the caller holds them (``best_of_settings(val, low, st)[1]``, what the plain interval is taken from;
    computed here when None)."""
    plain = best_of_settings(val, low, st)[1] if plain is None else plain
    out = plain.copy()
    if not np.isfinite(kappa):
        return out
    groups = _brackets(val, st, plain, tried)
    per_b = np.full(plain.shape, np.nan)  # each replicate's three-point curvature per batch size
    for i, rows, cols, x, _, _ in groups:
        if len(cols) == 3:
            per_b[rows, i] = curvatures_batched(x, val[rows][:, cols])
    with warnings.catch_warnings():  # a replicate with no convex three-point batch size: the point's curvature
        warnings.simplefilter("ignore", RuntimeWarning)
        own = np.nanmedian(per_b, axis=1)
    own = np.where(np.isfinite(own), own, kappa)
    for i, rows, cols, x, lo, hi in groups:
        if len(cols) < 2:
            continue
        y = np.log(val[rows][:, cols])
        gap, _ = vertex_fit_batched(x, y, lo, hi, own[rows])
        out[rows, i] = np.exp(y[:, 0] - gap)
    return out
