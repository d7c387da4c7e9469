"""Samplers compared in one sweep: the gain each allocation is predicted to give (from the uniform trials' per-bin
and global GNS measurements, ``analysis.core.allocation``) beside the gain measured in steps-to-target
(docs/allocation.md).

Trials are split by their ``timestep_sampling`` column (absent: ``uniform``). **Predicted**: the uniform trials' GNS
measurements in the window ending where each reached the target are pooled (per bin ``m_k = |G_k|^2 + tr Sigma_k``,
globally ``|G|^2``) and ``analysis.core.allocation.predict`` gives ``tr Sigma``, ``B_simple`` and ``S_p / S_u`` per
batch size for the uniform allocation, the Neyman allocation (``noise``, with the floor) and each sampler's last logged
allocation. **Measured**: ``analysis.fits.sweep_fit.analyze_metric`` per sampler and the ratio of best steps per batch
size, with a delta-method SE from the seeds' scatter; where a sampler's fit is impossible (fewer than 3 batch sizes
reach the target), its trials paired with the uniform ones by seed and setting
(``analysis.features.allocation.allocation_pairs``)."""

from __future__ import annotations

import math

import numpy as np

from analysis.core import gns
from analysis.core import metrics as M
from analysis.core.allocation import bin_shares, noise_allocation, predict
from analysis.core.bins import timestep_bins
from analysis.features.allocation.allocation_pairs import paired_ratios
from analysis.fits import gns_view
from analysis.fits.steps import steps_to_target
from analysis.fits.sweep_fit import analyze_metric
from analysis.reporting.trust_note import untrusted_line
from analysis.sources.loaders import UNIFORM, Runs, samplers_of, subset


def _window(runs: Runs, row: int, k: int | None, end: float, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-measurement unbiased ``(|G|^2, tr Sigma)`` of trial ``row`` (global or bin k), steps in (end-w, end]."""
    cols = [gns_view._rows(runs, name, row) for name in gns_view.gns_names(k)]
    step = cols[0][0]
    if not len(step) or any(len(c[1]) != len(step) for c in cols):
        return np.zeros(0), np.zeros(0)
    sel = (step > end - window) & (step <= end)
    small, big, b, B = (c[1][sel] for c in cols)
    if not sel.any():
        return np.zeros(0), np.zeros(0)
    return np.atleast_1d(gns.g2_unbiased(small, big, b, B)), np.atleast_1d(gns.trace_unbiased(small, big, b, B))


def uniform_statistics(
    runs: Runs, target: float | None, sampler: str = UNIFORM, traces: list | None = None
) -> tuple[list[np.ndarray], np.ndarray, list[str]]:
    """Pooled ``(m samples per bin, global |G|^2 samples, trial ids used)`` of the ``sampler`` trials' windows (the
    uniform ones by default); ``traces`` collects the global ``tr Sigma`` samples when given."""
    ks = gns_view.bins_in(runs, "gns/")
    loss = runs.series(M.EVAL_LOSS)
    m_s: list[list[np.ndarray]] = [[] for _ in ks]
    g_s, used = [], []
    for row in np.flatnonzero(samplers_of(runs) == sampler):
        lo, hi = np.searchsorted(loss.trial, [row, row + 1])
        if hi == lo:
            continue
        end = float(loss.step[hi - 1])
        if target is not None:
            hit = steps_to_target(type(loss)(loss.trial[lo:hi] * 0, loss.step[lo:hi], loss.value[lo:hi]), 1, [target])
            end = float(hit[0, 0]) if np.isfinite(hit[0, 0]) else end
        # one span for the global and the per-bin samples, never reaching back past half the steps so far (the
        # global live rule, analysis.core.gns.window_span): |G|^2 falls ~600x in the first tens of steps, and a global
        # window holding them (every step) beside per-bin measurements that do not (every gns_every steps) mixes
        # two different |G|^2, and the predicted uniform B_simple then falls far below the measured one
        window = int(gns.window_span(int(end), gns_view.window_of(runs, int(row)), half=True))
        g2, tr = _window(runs, int(row), None, end, window)
        per_bin = [_window(runs, int(row), k, end, window) for k in ks]
        if len(g2) < 2 or any(len(g) < 1 for g, _ in per_bin):
            continue
        g_s.append(g2)
        if traces is not None:
            traces.append(tr)
        for j, (g, t) in enumerate(per_bin):
            m_s[j].append(g + t)
        used.append(runs.trial_ids[row])
    return [np.concatenate(x) if x else np.zeros(0) for x in m_s], (np.concatenate(g_s) if g_s else np.zeros(0)), used


def logged_allocation(runs: Runs, sampler: str, num_bins: int) -> np.ndarray | None:
    """Mean over ``sampler``'s trials of the last allocation each logged (``alloc/bin{k}/p``); None if none did."""
    rows = np.flatnonzero(samplers_of(runs) == sampler)
    out = []
    for row in rows:
        last = []
        for k in range(num_bins):
            s = runs.series(M.per_bin(M.ALLOC_BIN_P, k))
            lo, hi = np.searchsorted(s.trial, [row, row + 1])
            last.append(s.value[hi - 1] if hi > lo else np.nan)
        if np.all(np.isfinite(last)):
            out.append(last)
    if not out:
        return None
    p = np.mean(out, axis=0)
    return p / p.sum()


def predictions(runs: Runs, target: float | None, batch_sizes, floor: float) -> dict:
    """Step 2 of the module docstring: ``{"trials", "q", "b_simple_bins", "allocations": {name: {...}}}``."""
    m_s, g_s, used = uniform_statistics(runs, target)
    if not used:
        raise ValueError("no uniform trial logged per-bin and global GNS in its window: nothing to predict from")
    K = len(m_s)
    q = bin_shares(K)
    allocs = {UNIFORM: q, "noise": noise_allocation([x.mean() for x in m_s], q, floor)}
    for name in sorted(set(samplers_of(runs)) - {UNIFORM}):
        p = logged_allocation(runs, name, K)
        if p is not None:
            allocs[f"{name} (logged)"] = p
    preds = predict(m_s, g_s, allocs, q, batch_sizes)
    return {
        "trials": used,
        "q": q.tolist(),
        "allocations": {
            a.name: {
                "p": a.p.tolist(),
                "trace": a.trace,
                "trace_se": a.trace_se,
                "b_simple": a.b_simple,
                "b_simple_se": a.b_simple_se,
                "ratio": a.ratio.tolist(),
                "ratio_se": a.ratio_se.tolist(),
            }
            for a in preds
        },  # fmt: skip
    }


def _seed_steps(runs: Runs, ids: list[str], target: float) -> np.ndarray:
    """Steps-to-target of the trials ``ids`` (one per seed of a setting)."""
    rows = [runs.trial_ids.index(t) for t in ids]
    steps = steps_to_target(runs.series(M.EVAL_LOSS), len(runs.trial_ids), [target])[0]
    return steps[rows]


def measured(runs: Runs, target: float, bootstrap: int = 200, seed: int = 0) -> dict:
    """Step 3: per sampler, B_crit (interval) and the best steps per batch size with the seeds' log-steps SE."""

    out = {}
    for name in sorted(set(samplers_of(runs)), key=lambda s: (s != UNIFORM, s)):
        sub = subset(runs, samplers_of(runs) == name)
        try:
            res = analyze_metric(sub, M.EVAL_LOSS, [target], bootstrap=bootstrap, seed=seed, strict=False, notes=[])
        except ValueError as e:
            out[name] = {"error": str(e)}
            continue
        if not res:
            out[name] = {"error": f"too few batch sizes reach {target}"}
            continue
        t = res[0]
        points = {}
        for p in t["points"]:
            s = np.log(_seed_steps(sub, p["trial_ids"], target))
            s = s[np.isfinite(s)]
            se = float(s.std(ddof=1) / math.sqrt(len(s))) if len(s) >= 2 else float("nan")
            points[int(p["batch_size"])] = {"steps": p["steps"], "log_se": se, "lr": p["lr"]}
        out[name] = {"b_crit": t["b_crit"], "b_crit_ci": t["b_crit_ci"], "flags": t["flags"], "points": points}
    return out


def compare(runs: Runs, target: float, floor: float = 0.1, bootstrap: int = 200, seed: int = 0) -> dict:
    """The whole comparison (prediction, measurement, ratios) as a JSON-able dict."""
    batch_sizes = sorted({int(b) for b in runs.batch_size})
    result: dict = {"target": target, "batch_sizes": batch_sizes, "floor": floor, "notes": []}
    try:
        result["predicted"] = predictions(runs, target, batch_sizes, floor)
    except ValueError as e:
        result["predicted"], result["notes"] = None, [f"no prediction: {e}"]
    result["measured"] = measured(runs, target, bootstrap, seed)
    for name, m in result["measured"].items():
        m["b_simple"], m["b_simple_se"] = measured_b_simple(runs, target, name)
    result["ratios"] = _ratio_rows(result)
    flags = sorted({f for m in result["measured"].values() for f in m.get("flags", [])})
    result["flags"] = flags  # bcrit analyze's flags on any sampler's fit at this target (analysis.fits.flags)
    result["warning"] = untrusted_line({float(target): flags}, "this comparison's measured B_crit and best steps")
    fitted = {r["sampler"] for r in result["ratios"]}
    kinds = samplers_of(runs)
    if UNIFORM in set(kinds):  # where a sampler's own fit failed (< 3 batch sizes): its trials paired with uniform's
        for r in paired_ratios(runs, kinds, target, UNIFORM):
            pa_ = _predicted_for(result["predicted"], r["sampler"])
            if r["sampler"] not in fitted:
                if pa_ is not None:
                    i = result["batch_sizes"].index(r["batch_size"])
                    r.update(predicted=pa_["ratio"][i], predicted_se=pa_["ratio_se"][i])
                result["ratios"].append(r)
    if len(set(kinds)) < 2:
        result["notes"].append("no measured S/S_uniform: every trial of the sweep is uniform (sweep "
                               "scientific.timestep_sampling: [uniform, noise] to measure the gain)")  # fmt: skip
    result["bins"] = _bin_rows(runs, result)
    return result


def measured_b_simple(runs: Runs, target: float, sampler: str) -> tuple[float | None, float | None]:
    """The global B_simple ± SE the ``sampler`` trials measured in their windows at the target (pooled): under a
    non-uniform sampler the training gradient is the weighted one, so this is ``tr Sigma(p) / |G|^2`` measured --
    the quantity ``predict`` predicts."""
    traces: list[np.ndarray] = []
    _, g2, used = uniform_statistics(runs, target, sampler, traces)
    if not used:
        return None, None
    value, se = gns.b_simple_with_se(g2, np.concatenate(traces))
    return (value, se) if math.isfinite(value) else (None, None)


def _predicted_for(pred: dict | None, name: str) -> dict | None:
    """The predicted allocation of sampler ``name``: the one its trials logged, else the one of that name."""
    allocs = (pred or {}).get("allocations", {})
    return allocs.get(f"{name} (logged)") or allocs.get(name)


def _ratio_rows(result: dict) -> list[dict]:
    meas, pred = result["measured"], result["predicted"]
    base = meas.get(UNIFORM, {}).get("points", {})
    rows = []
    for name, m in meas.items():
        if name == UNIFORM or "points" not in m:
            continue
        pa_ = _predicted_for(pred, name)
        for i, b in enumerate(result["batch_sizes"]):
            if b not in base or b not in m["points"]:
                continue
            r = m["points"][b]["steps"] / base[b]["steps"]
            se = r * math.hypot(m["points"][b]["log_se"], base[b]["log_se"])
            row = {"sampler": name, "batch_size": b, "measured": r, "measured_se": se}
            if pa_ is not None:
                row.update(predicted=pa_["ratio"][i], predicted_se=pa_["ratio_se"][i])
            rows.append(row)
    return rows


def _bin_rows(runs: Runs, result: dict) -> list[dict]:
    """Per bin: timesteps, the uniform trials' per-bin B_simple (window means) and every allocation's p_k."""
    pred = result["predicted"]
    if pred is None:
        return []
    K = len(pred["q"])
    rows = []
    for k, (lo, hi) in enumerate(timestep_bins(K)):
        row = {"bin": k, "timesteps": [lo, hi]}
        uni = subset(runs, samplers_of(runs) == UNIFORM)
        est = [_bin_b_simple(uni, r, k) for r in range(len(uni.trial_ids))]
        est = [e for e in est if e is not None]
        row["b_simple"] = float(np.mean(est)) if est else None
        row["p"] = {name: a["p"][k] for name, a in pred["allocations"].items()}
        rows.append(row)
    return rows


def _bin_b_simple(runs: Runs, row: int, k: int) -> float | None:
    tr = gns_view.b_simple_trace(runs, row, k)
    if tr is None or not np.isfinite(tr.b_simple).any():
        return None
    return float(tr.b_simple[np.isfinite(tr.b_simple)][-1])
