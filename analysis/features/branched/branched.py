"""Critical batch size *during* training, from branches of one run (Merrill et al. 2025, arXiv 2505.23971, Sec. 3).

A reference trial at batch size ``B0`` keeps checkpoints at branch points; from each, branches train at ``k·B0``
(lr scaled by a rule, optimizer state kept) for the same ``Δ`` examples. The critical batch size there is the largest
``k·B0`` with ``excess(k) = L_k / L_cmp - 1 <= ε`` (relative: per-bin losses have their own scales). Choices, each
recorded in the result: ``compare`` (``"reference"``: the ``k = 1`` branch of the same seed, same kinds of noise;
``"best"``: the lowest loss over the multipliers); ``window`` (the loss is the mean of the evaluations in ``[(1 -
window)·Δ, Δ]``; every branch evaluates at the same example counts); **seeds** are averaged per ``k`` before the rule
(a minimum over seeds biases low), the interval a percentile bootstrap over seeds; ``b_crit`` interpolates ``excess``
linearly in ``log k`` past the largest ``k`` within tolerance (``b_crit_grid``: the grid answer), a lower bound
(``bound="lower"``) when the largest multiplier is within, an upper one at the smallest when none is. A diverged branch
has ``L = inf``; a failed or unfinished one is left out of its seed's average for that ``k``. Rows: a branched
study's ``trials.parquet`` carries :data:`analysis.sources.schema.BRANCH_COLUMNS` (null on the reference's row); branch
rows count ``step`` and ``examples`` from the branch point, whose training progress is ``branch_step · B0``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.core import metrics as m
from analysis.core.bins import timestep_bins
from analysis.fits import gns_view
from analysis.sources.loaders import Runs
from analysis.sources.schema import BRANCH_COLUMNS, PARENT, RunsTableError

COMPARE = ("reference", "best")


# --- the smoothed loss after Δ examples ---------------------------------------------------------------------------
def window_mean(examples: np.ndarray, values: np.ndarray, delta: float, window: float) -> float:
    """Mean of ``values`` at ``examples`` in ``[(1 - window)·delta, delta]``; ``nan`` when none lies there.

    Non-finite values (a diverged evaluation) make the mean ``inf``."""
    ex, v = np.asarray(examples, dtype=np.float64), np.asarray(values, dtype=np.float64)
    sel = (ex >= (1.0 - window) * delta - 1e-9) & (ex <= delta + 1e-9)
    if not sel.any():
        return float("nan")
    v = v[sel]
    return float(v.mean()) if np.isfinite(v).all() else float("inf")


# --- the rule at one branch point -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Crossing:
    k: float  # interpolated multiplier (or the grid one, see bound / interpolated)
    k_grid: float  # largest multiplier within tolerance (the smallest multiplier when none is)
    bound: str | None  # None | "lower" (largest multiplier within tolerance) | "upper" (none within tolerance)


def excess(ks: np.ndarray, loss: np.ndarray, compare: str) -> np.ndarray:
    """``L_k / L_cmp - 1`` for losses ``(K,)`` over ascending multipliers ``ks`` (``nan`` where missing)."""
    loss = np.asarray(loss, dtype=np.float64)
    if compare == "reference":
        one = np.flatnonzero(np.isclose(ks, 1.0))
        if len(one) == 0:
            raise RunsTableError("compare='reference' needs k = 1 branches (the reference continued); add 1 to k")
        cmp = loss[one[0]]
    elif compare == "best":
        fin = loss[np.isfinite(loss)]
        cmp = fin.min() if len(fin) else np.nan
    else:
        raise ValueError(f"compare must be one of {list(COMPARE)}, got {compare!r}")
    with np.errstate(invalid="ignore", divide="ignore"):
        return loss / cmp - 1.0


def crossing(ks: np.ndarray, exc: np.ndarray, eps: float) -> Crossing | None:
    """The largest multiplier whose excess is ``<= eps``, interpolated in ``log k`` towards the next one.

    ``None`` when no multiplier has a usable (non-missing) loss."""
    ks, exc = np.asarray(ks, dtype=np.float64), np.asarray(exc, dtype=np.float64)
    have = ~np.isnan(exc)
    ks, exc = ks[have], exc[have]
    if len(ks) == 0:
        return None
    ok = exc <= eps
    if not ok.any():
        return Crossing(float(ks[0]), float(ks[0]), "upper")
    q = int(np.flatnonzero(ok)[-1])
    if q == len(ks) - 1:
        return Crossing(float(ks[q]), float(ks[q]), "lower")
    e0, e1 = exc[q], exc[q + 1]
    if not np.isfinite(e1) or not np.isfinite(e0):  # the next one diverged: nothing to interpolate on
        return Crossing(float(ks[q]), float(ks[q]), None)
    frac = (eps - e0) / (e1 - e0)  # in [0, 1): e0 <= eps < e1
    logk = math.log(ks[q]) + frac * (math.log(ks[q + 1]) - math.log(ks[q]))
    return Crossing(math.exp(logk), float(ks[q]), None)


def seed_mean(loss: np.ndarray) -> np.ndarray:
    """Mean over the last axis (seeds) ignoring missing (``nan``) entries; ``inf`` if any seed diverged."""
    loss = np.asarray(loss, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        have = ~np.isnan(loss)
        n = have.sum(axis=-1)
        s = np.where(have, loss, 0.0).sum(axis=-1)
        out = np.where(n > 0, s / np.maximum(n, 1), np.nan)
    return out


def critical_k(
    ks: np.ndarray,
    loss: np.ndarray,
    eps: float,
    compare: str = "reference",
    bootstrap: int = 200,
    level: float = 0.9,
    rng: np.random.Generator | None = None,
) -> dict:
    """The rule at one branch point from losses ``(K, S)`` (multipliers x seeds).

    Returns ``{"k", "k_grid", "bound", "k_ci", "k_per_seed"}`` (``k_ci`` from a bootstrap over seeds; ``None``
    with one seed)."""
    ks = np.asarray(ks, dtype=np.float64)
    loss = np.asarray(loss, dtype=np.float64).reshape(len(ks), -1)
    c = crossing(ks, excess(ks, seed_mean(loss), compare), eps)
    if c is None:
        return {"k": None, "k_grid": None, "bound": None, "k_ci": [None, None], "k_per_seed": []}
    per_seed = [crossing(ks, excess(ks, loss[:, s], compare), eps) for s in range(loss.shape[1])]
    ci: list = [None, None]
    n_seeds = loss.shape[1]
    if n_seeds > 1 and bootstrap > 0:
        rng = rng or np.random.default_rng(0)
        idx = rng.integers(0, n_seeds, size=(bootstrap, n_seeds))
        vals = []
        for row in idx:
            b = crossing(ks, excess(ks, seed_mean(loss[:, row]), compare), eps)
            if b is not None:
                vals.append(b.k)
        if vals:
            lo, hi = np.percentile(np.log(vals), [50 * (1 - level), 50 * (1 + level)])
            ci = [float(np.exp(lo)), float(np.exp(hi))]
    return {
        "k": c.k,
        "k_grid": c.k_grid,
        "bound": c.bound,
        "k_ci": ci,
        "k_per_seed": [None if p is None else p.k for p in per_seed],
    }


# --- a branched study's rows ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Study:
    """Where a branched study's rows are: reference row, branch rows by (point, k, seed)."""

    ref_row: int
    ref_id: str
    b0: int
    delta: int  # examples per branch
    points: np.ndarray  # (P,) reference steps branched from, ascending
    ks: np.ndarray  # (K,) multipliers, ascending
    seeds: np.ndarray  # (S,)
    rows: np.ndarray  # (P, K, S) trial row of each branch; -1 = absent


def _column(runs: Runs, name: str) -> list:
    return (
        pc.cast(runs.trials.column(name), pa.string()).to_pylist()
        if name == PARENT
        else runs.trials.column(name).to_pylist()
    )


def study_of(runs: Runs, delta: int | None = None) -> Study:
    """Index a branched study's trials (one reference; branches name it in ``parent_trial_id``)."""
    names = runs.trials.column_names
    missing = [c for c in BRANCH_COLUMNS if c not in names]
    if missing:
        raise RunsTableError(f"trials.parquet has no column {missing[0]!r}: not a branched study (bcrit branch)")
    parent, step, k = (_column(runs, c) for c in BRANCH_COLUMNS)
    branch = [i for i, p in enumerate(parent) if p]
    if not branch:
        raise RunsTableError("trials.parquet has no branch rows (parent_trial_id is null everywhere)")
    refs = sorted({parent[i] for i in branch})
    if len(refs) != 1:
        raise RunsTableError(f"branches of {len(refs)} reference trials {refs[:3]}; analyse one study at a time")
    ids = runs.trial_ids
    if refs[0] not in ids:
        raise RunsTableError(f"the reference trial {refs[0]!r} named by the branches is not in trials.parquet")
    ref_row = ids.index(refs[0])
    bs = runs.batch_size
    b0 = int(bs[ref_row])
    seeds_all = runs.trials.column("seed").to_numpy()
    points = np.array(sorted({int(step[i]) for i in branch}), dtype=np.int64)
    ks = np.array(sorted({float(k[i]) for i in branch}), dtype=np.float64)
    seeds = np.array(sorted({int(seeds_all[i]) for i in branch}), dtype=np.int64)
    rows = np.full((len(points), len(ks), len(seeds)), -1, dtype=np.int64)
    for i in branch:
        p = int(np.searchsorted(points, int(step[i])))
        j = int(np.searchsorted(ks, float(k[i])))
        s = int(np.searchsorted(seeds, int(seeds_all[i])))
        if rows[p, j, s] >= 0:
            raise RunsTableError(
                f"two branches at step {step[i]}, k={k[i]}, seed {seeds_all[i]}: {ids[rows[p, j, s]]!r} and "
                f"{ids[i]!r}; keep one"
            )
        if int(bs[i]) != round(float(k[i]) * b0):
            raise RunsTableError(f"branch {ids[i]!r}: batch_size {bs[i]} != k {k[i]} x B0 {b0}")
        rows[p, j, s] = i
    if delta is None:
        delta = _infer_delta(runs, [i for i in branch])
    return Study(ref_row, refs[0], b0, int(delta), points, ks, seeds, rows)


def _infer_delta(runs: Runs, branch_rows: list[int]) -> int:
    """Δ = the largest branch ``max_steps × batch_size`` (trials.parquet ``max_steps``), else the largest examples
    any branch reported."""
    if "max_steps" in runs.trials.column_names:
        ms = runs.trials.column("max_steps").to_numpy(zero_copy_only=False)
        vals = [ms[i] * runs.batch_size[i] for i in branch_rows if ms[i] is not None and np.isfinite(ms[i])]
        if vals:
            return int(round(max(vals)))
    s = runs.series(m.EVAL_LOSS)
    sel = np.isin(s.trial, branch_rows)
    if not sel.any():
        raise RunsTableError("no branch reported eval/loss; cannot infer the branch length Δ")
    return int((s.step[sel] * runs.batch_size[s.trial[sel]]).max())


def end_losses(runs: Runs, study: Study, metric: str, window: float) -> np.ndarray:
    """Smoothed loss after Δ examples of every branch, ``(P, K, S)``: ``inf`` for a diverged branch, ``nan`` for a
    failed, unfinished or absent one."""
    series = runs.series(metric)
    status = runs.status
    out = np.full(study.rows.shape, np.nan)
    for idx in np.ndindex(study.rows.shape):
        r = int(study.rows[idx])
        if r < 0 or status[r] in (m.STATUS_FAILED, m.STATUS_RUNNING):
            continue
        if status[r] == m.STATUS_DIVERGED:
            out[idx] = np.inf
            continue
        lo, hi = np.searchsorted(series.trial, [r, r + 1])
        ex = series.step[lo:hi] * runs.batch_size[r]
        out[idx] = window_mean(ex, series.value[lo:hi], study.delta, window)
    return out


def analyze_metric(
    runs: Runs,
    study: Study,
    metric: str,
    epsilons: list[float],
    compare: str = "reference",
    window: float = 0.0,
    bootstrap: int = 200,
    level: float = 0.9,
    seed: int = 0,
) -> list[dict]:
    """Per branch point: progress, the losses per ``k`` (seed means) and the answer at every ``ε``."""
    loss = end_losses(runs, study, metric, window)  # (P, K, S)
    ref = runs.series(metric)
    lo, hi = np.searchsorted(ref.trial, [study.ref_row, study.ref_row + 1])
    out = []
    for p, step in enumerate(study.points):
        at = np.flatnonzero(ref.step[lo:hi] == step)
        by_eps = []
        for e_i, eps in enumerate(epsilons):
            rng = np.random.default_rng([seed, p, e_i])
            r = critical_k(study.ks, loss[p], eps, compare, bootstrap, level, rng)
            scale = lambda v: None if v is None else float(v) * study.b0  # noqa: E731
            by_eps.append(
                {
                    "epsilon": float(eps),
                    "b_crit": scale(r["k"]),
                    "b_crit_grid": scale(r["k_grid"]),
                    "bound": r["bound"],
                    "b_crit_ci": [scale(v) for v in r["k_ci"]],
                    "b_crit_per_seed": [scale(v) for v in r["k_per_seed"]],
                }
            )
        mean = seed_mean(loss[p])
        out.append(
            {
                "branch_step": int(step),
                "examples": int(step) * study.b0,  # training progress: the reference's examples at the point
                "loss_at_point": float(ref.value[lo:hi][at[0]]) if len(at) else None,
                "loss_after_delta": {f"{k:g}": _num(v) for k, v in zip(study.ks, mean, strict=True)},
                "by_epsilon": by_eps,
            }
        )
    return out


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def analyze(
    runs: Runs,
    epsilons: list[float] = (0.01, 0.02, 0.05),
    compare: str = "reference",
    window: float = 0.0,
    *,
    delta: int | None = None,
    bootstrap: int = 200,
    level: float = 0.9,
    seed: int = 0,
    num_timesteps: int = 1000,
) -> dict:
    """The branched study's answer: globally (``eval/loss``) and per timestep bin (``eval/loss/bin{k}``), with the
    live ``B_simple`` of the reference at each branch point beside it (re-smoothed over the reference's own GNS
    window), and what the study cost in examples."""

    if compare not in COMPARE:
        raise ValueError(f"compare must be one of {list(COMPARE)}, got {compare!r}")
    if not 0.0 <= window < 1.0:
        raise ValueError(f"window must be in [0, 1), got {window}")
    if not epsilons or not all(e >= 0 for e in epsilons):
        raise ValueError(f"epsilons must be a non-empty list of tolerances >= 0, got {list(epsilons)}")
    study = study_of(runs, delta)
    kw = dict(compare=compare, window=window, bootstrap=bootstrap, level=level, seed=seed)
    eps = [float(e) for e in epsilons]
    result = {
        "kind": "branched",
        "metric": m.EVAL_LOSS,
        "reference_trial": study.ref_id,
        "b0": study.b0,
        "delta_examples": study.delta,
        "multipliers": [float(k) for k in study.ks],
        "seeds": [int(s) for s in study.seeds],
        "epsilons": eps,
        "compare": compare,
        "window": window,
        "bootstrap": {"replicates": bootstrap, "level": level, "seed": seed},
        "points": analyze_metric(runs, study, m.EVAL_LOSS, eps, **kw),
    }
    trace = gns_view.b_simple_trace(runs, study.ref_row, None)
    for pt in result["points"]:
        pt["b_simple"] = _num(gns_view.b_simple_at(trace, pt["branch_step"]))
    ks = gns_view.bins_in(runs, m.EVAL_LOSS + "/")
    ranges = timestep_bins(max(ks) + 1, num_timesteps) if ks else []
    result["bins"] = []
    for b in ks:
        pts = analyze_metric(runs, study, m.per_bin(m.EVAL_LOSS_BIN, b), eps, **kw)
        tr = gns_view.b_simple_trace(runs, study.ref_row, b)
        for pt in pts:
            pt["b_simple"] = _num(gns_view.b_simple_at(tr, pt["branch_step"]))
        result["bins"].append({"bin": b, "timesteps": list(ranges[b]), "points": pts})
    result["cost"] = cost(runs, study)
    result["n_trials"] = len(runs.trial_ids)
    result["source"] = runs.source
    return result


def cost(runs: Runs, study: Study) -> dict:
    """Examples trained: the reference (up to its last step) and the branches (their reported examples)."""
    s = runs.series(m.EVAL_LOSS)
    last = np.zeros(len(runs.trial_ids))
    if len(s.trial):
        ends = np.flatnonzero(np.append(s.trial[1:] != s.trial[:-1], True))
        last[s.trial[ends]] = s.step[ends]
    ex = last * runs.batch_size
    branch = study.rows[study.rows >= 0]
    return {
        "reference_examples": int(ex[study.ref_row]),
        "branch_examples": int(ex[branch].sum()),
        "total_examples": int(ex[study.ref_row] + ex[branch].sum()),
    }
