"""Synthetic sweeps with a known hyperbola ``S(B) = S_min + E_min/B`` (test helper, not a test module).

Every trial follows ``L(s) = floor + (L0 - floor) / (1 + s/tau)**alpha`` with ``tau = S(B) · penalty(lr)
· noise``: the best learning rate per batch size has penalty 1, others more; noise is multiplicative
(lognormal). The steps to reach a target ``y`` are ``u(y)·tau`` with ``u(y) =
((L0-floor)/(y-floor))**(1/alpha) - 1``, so the true ``B_crit = E_min/S_min`` at every target and
``S_min(y) = u(y)·S_min``.

Realistic-sweep options (all off by default): the best learning rate off the grid and drifting with ``B``
(``lr_opt``, ``lr_drift``: the penalty's minimum sits at ``log2 f = lr_opt + lr_drift·log2(B/256)``), noisier small
batches (``sigma_power``), additive evaluation noise (``eval_noise``: single runs fluctuate around their curve), trials
stopped at a global target on ``eval/loss`` (``stop_at``: every metric's series ends at that evaluation, as a sweep's
``stopping.target_loss`` does), and per-bin curves with their own ``E_min`` and best learning rate (``bin_e_min``,
``bin_lr_opt``; the true per-bin ``B_crit`` is ``bin_e_min[k] / s_min``).
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import numpy as np
import pyarrow as pa

from analysis.core import metrics as m
from analysis.fits.gns_view import gns_names
from analysis.sources.loaders import Runs, runs_from_tables
from analysis.sources.schema import METRICS_SCHEMA, trials_table

L0, FLOOR, ALPHA = 1.0, 0.1, 1.0


def u_of(target: float) -> float:
    """Progress (in units of tau) at which the synthetic curve reaches ``target``."""
    return ((L0 - FLOOR) / (target - FLOOR)) ** (1 / ALPHA) - 1


def synth_runs(
    rng: np.random.Generator,
    s_min: float = 200.0,
    e_min: float = 200.0 * 256,
    batch_sizes: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    lr_factors: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0),
    seeds: int = 2,
    sigma: float = 0.1,
    n_evals: int = 60,
    diverge_factor: float = 4.0,
    budget_u: float = 9.0,
    bins: int = 0,
    gns: bool = False,
    lr_opt: float = 0.0,
    lr_drift: float = 0.0,
    sigma_power: float = 0.0,
    eval_noise: float = 0.0,
    stop_at: float | None = None,
    bin_e_min: tuple[float, ...] | None = None,
    bin_lr_opt: tuple[float, ...] | None = None,
) -> Runs:
    """A sweep: batch sizes × learning-rate factors × seeds; ``lr = diverge_factor·opt`` trials diverge."""
    grid = np.array([(b, f, s) for b in batch_sizes for f in lr_factors for s in range(seeds)], dtype=np.float64)
    b, f, seed = grid.T
    n = len(grid)
    opt = lr_opt + lr_drift * np.log2(b / 256)
    noise = rng.lognormal(0.0, sigma * (256 / b) ** sigma_power, n)
    tau = (s_min + e_min / b) * (1.0 + 0.3 * (np.log2(f) - opt) ** 2) * noise  # (n,)
    budget = budget_u * (s_min + e_min / b)  # (n,) steps: the same budget for every lr at a batch size
    every = np.maximum(1, np.round(budget / n_evals)).astype(np.int64)
    step = every[:, None] * np.arange(n_evals + 1)[None, :]  # (n, E+1), starts at step 0

    def curve(tau: np.ndarray) -> np.ndarray:
        out = FLOOR + (L0 - FLOOR) / (1.0 + step / tau[:, None]) ** ALPHA
        return out + (rng.normal(0.0, eval_noise, out.shape) if eval_noise else 0.0)

    loss = curve(tau)
    curves = [loss]
    for k in range(bins):
        e_k = e_min if bin_e_min is None else bin_e_min[k]
        opt_k = opt if bin_lr_opt is None else bin_lr_opt[k] + lr_drift * np.log2(b / 256)
        curves.append(curve((s_min + e_k / b) * (1.0 + 0.3 * (np.log2(f) - opt_k) ** 2) * noise))
    diverged = f >= diverge_factor
    for c in curves:
        c[diverged, n_evals // 3 :] = np.nan  # blew up: later evaluations are NaN
    ids = [f"t{i:04d}" for i in range(n)]
    status = np.where(diverged, m.STATUS_DIVERGED, m.STATUS_BUDGET_SPENT).astype(object)
    status[(loss[:, -1] < 0.2) & ~diverged] = m.STATUS_REACHED_TARGET
    keep = np.ones(step.shape, dtype=bool)  # evaluations the trial made before it stopped
    if stop_at is not None:
        hit = loss <= stop_at
        stopped = hit.any(axis=1) & ~diverged
        first = np.where(stopped, hit.argmax(axis=1), n_evals)
        keep = np.arange(n_evals + 1)[None, :] <= first[:, None]
        status = np.where(diverged, m.STATUS_DIVERGED, m.STATUS_BUDGET_SPENT).astype(object)
        status[stopped] = m.STATUS_REACHED_TARGET
    trials = trials_table(
        {
            "trial_id": ids,
            "batch_size": b.astype(np.int64),
            "micro_batch_size": b.astype(np.int64),
            "grad_accum": np.ones(n, np.int64),
            "num_workers": np.ones(n, np.int64),
            "lr": 1e-3 * f * np.sqrt(b / 256),
            "seed": seed.astype(np.int64),
            "status": list(status),
        }
    )
    names = [m.EVAL_LOSS] + [m.per_bin(m.EVAL_LOSS_BIN, k) for k in range(bins)]
    cols: dict[str, list] = {k: [] for k in METRICS_SCHEMA.names}
    tid = np.repeat(ids, n_evals + 1).reshape(step.shape)
    for j, name in enumerate(names):
        scale = 1.0 + 0.5 * j  # bins: the same shape on another loss scale
        cols["trial_id"].append(tid[keep])
        cols["step"].append(step[keep])
        cols["examples"].append((step * b[:, None].astype(np.int64))[keep])
        cols["metric"].append(np.full(int(keep.sum()), name))
        cols["value"].append((curves[j] * scale)[keep])
    if gns:  # |G|^2 falls with the loss, tr(Sigma) stays: B_simple = tr/|G|^2 grows over training
        for k in [None, *range(bins)]:
            g2 = 10.0 * (loss - FLOOR) * (1.0 + 0.5 * (k or 0))
            trace = np.full_like(g2, 100.0)
            bb = np.broadcast_to(b[:, None], g2.shape)
            noise = rng.normal(0.0, 0.05, (2, *g2.shape))
            vals = [g2 + trace / (bb / 4) * (1 + noise[0]), g2 + trace / bb * (1 + noise[1]), bb / 4, bb]
            for name, val in zip(gns_names(k), vals, strict=True):
                cols["trial_id"].append(tid[keep])
                cols["step"].append(step[keep])
                cols["examples"].append((step * b[:, None].astype(np.int64))[keep])
                cols["metric"].append(np.full(int(keep.sum()), name))
                cols["value"].append(np.nan_to_num(val, nan=1e9)[keep])
    metrics = pa.table({k: np.concatenate(v) for k, v in cols.items()}, schema=METRICS_SCHEMA)
    return runs_from_tables(trials, metrics, source="synthetic")


# A sweep shaped like a real one for the coverage figure: 3 seeds per setting, 10% seed-to-seed scatter of the
# steps, 5 learning rates (the top one diverges), trials stopped at a global target 0.2 (so trials are censored
# below it), targets above it. True B_crit = 256 at every target.
COVERAGE_SWEEP = dict(seeds=3, sigma=0.1, stop_at=0.2)
COVERAGE_TARGETS = (0.3, 0.25)


def coverage_draws(
    draws: int, bootstrap: int, first_seed: int = 100, level: float = 0.9, processes: int = 1, **kw
) -> dict:
    """Analyse ``draws`` simulated sweeps (``synth_runs(**COVERAGE_SWEEP, **kw)``) with known ``B_crit = 256``, over
    ``processes`` processes (the same numbers with any).

    Returns arrays over (draw, target): ``b_crit``, ``lo``, ``hi``, ``flagged`` and the scalars ``coverage`` (share
    of intervals holding 256), ``median_error`` (median ``|B_crit/256 - 1|``), ``width_ratio`` (mean log half-width of
    the interval over ``z·sd`` of the log estimates, ``z`` the normal quantile of ``level``: 1 when the interval is
    as wide as the estimates' spread says it should be)."""
    from statistics import NormalDist

    cfg = {**COVERAGE_SWEEP, **kw}
    one = partial(_coverage_draw, bootstrap=bootstrap, first_seed=first_seed, level=level, cfg=cfg)
    rows = [r for rs in map_draws(one, range(draws), processes) for r in rs]
    est, lo, hi = (np.array([r[i] for r in rows], dtype=np.float64) for i in range(3))
    z = NormalDist().inv_cdf((1 + level) / 2)
    return {
        "b_crit": est,
        "lo": lo,
        "hi": hi,
        "flagged": np.array([r[3] for r in rows]),
        "coverage": float(np.mean((lo <= 256) & (256 <= hi))),
        "median_error": float(np.median(np.abs(est / 256 - 1))),
        "width_ratio": float(np.mean(np.log(hi / lo) / 2) / (z * np.std(np.log(est)))),
        "bias": float(np.mean(est / 256 - 1)),
    }


def _coverage_draw(d: int, bootstrap: int, first_seed: int, level: float, cfg: dict) -> list[tuple]:
    """Draw ``d`` of :func:`coverage_draws`: ``(b_crit, lo, hi, flagged)`` per target."""
    from analysis.fits.sweep_fit import analyze_metric

    runs = synth_runs(np.random.default_rng(first_seed + d), **cfg)
    res = analyze_metric(runs, m.EVAL_LOSS, list(COVERAGE_TARGETS), bootstrap=bootstrap, seed=d, level=level)
    return [(r["b_crit"], r["b_crit_ci"][0], r["b_crit_ci"][1], bool(r["flags"])) for r in res]


def map_draws(fn: Callable, items: Iterable, processes: int = 1) -> list:
    """``[fn(x) for x in items]`` in that order, over ``processes`` spawned processes when more than one (``fn``
    pickled by name: a module-level function or a ``partial`` of one). The coverage tests' draws are independent and
    each seeded by its own index, so spreading them changes no number, only the suite's time on more than one core."""
    items = list(items)
    if processes <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ProcessPoolExecutor(min(processes, len(items)), mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(fn, items))
