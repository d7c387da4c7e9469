"""The answer to the two halves of bcrit's question, from a sweep's analysis (``bcrit.json``'s ``"answer"``).

1. "How large a batch before extra GPUs stop buying fewer steps?" -- the trustworthy global targets' B_crit with
   their intervals (:func:`analysis.fits.trust.headline`).
2. "Does that differ across diffusion timesteps?" -- per timestep bin, B_crit at **one common point of training**:
   for a trustworthy global target ``y``, bin ``k``'s matched target is the median bin-``k`` eval loss of the global
   target's fitted trials (every seed of each batch size's best setting) where their global eval loss crosses ``y``.
   Each bin is analysed at its matched target as the global loss is, beside its B_simple at the crossings. The
   global target with the most trustworthy bins is quoted (the lowest on a tie: further into training).

Two bins "differ beyond their intervals" when one's lower end lies above the other's upper end."""

from __future__ import annotations

import numpy as np

from analysis.core import metrics as m
from analysis.fits import gns_view, pareto
from analysis.fits.steps import steps_to_target
from analysis.fits.trust import headline
from analysis.sources.loaders import Runs


def matched_bin_target(runs: Runs, metric: str, target: dict, k: int) -> float | None:
    """Bin ``k``'s eval loss at the point of training where the target's fitted trials reach ``target``."""
    row_of = {t: i for i, t in enumerate(runs.trial_ids)}
    rows = sorted({row_of[t] for p in target["points"] for t in p.get("trial_ids", [p["trial_id"]])})
    cross = steps_to_target(runs.series(metric), len(runs.trial_ids), [target["target"]])[0]
    s = runs.series(m.per_bin(m.EVAL_LOSS_BIN, k))
    vals = []
    for r in rows:
        if not np.isfinite(cross[r]):
            continue
        lo, hi = np.searchsorted(s.trial, [r, r + 1])
        step, v = s.step[lo:hi].astype(np.float64), s.value[lo:hi]
        ok = np.isfinite(v)
        if ok.sum() >= 2:
            vals.append(float(np.interp(cross[r], step[ok], v[ok])))
    return float(f"{np.median(vals):.4g}") if vals else None


def bins_at(
    runs: Runs,
    metric: str,
    target: dict,
    ks: list[int],
    ranges: dict,
    analyze_metric,
    kw: dict,
    gns_window: int | None = None,
) -> list:
    """Every bin analysed at its matched target for one global ``target``: ``[{"bin", "timesteps", "target",
    "entry"}]`` (``entry`` is :func:`analysis.fits.sweep_fit.analyze_metric`'s target dict, ``None`` when too few batch
    sizes reach it)."""
    out = []
    for k in ks:
        y = matched_bin_target(runs, metric, target, k)
        entry, notes = None, []
        if y is not None:
            try:
                got = analyze_metric(runs, m.per_bin(m.EVAL_LOSS_BIN, k), [y], strict=False, notes=notes, **kw)
            except pareto.TooFewBatchSizesError as e:
                notes.append(str(e))
                got = []
            if got:
                gns_view.attach_b_simple(runs, got, k, gns_window)
                entry = got[0]
        out.append({"bin": k, "timesteps": list(ranges[k]), "target": y, "entry": entry, "notes": notes})
    return out


def build(runs: Runs, result: dict, analyze_metric, kw: dict, gns_window: int | None = None) -> dict:
    """``{"global": [trustworthy target entries], "at_target", "bins": [...], "sentence"}`` (see module doc)."""
    trusted = headline(result["targets"])
    ks = [b["bin"] for b in result.get("bins", [])]
    ranges = {b["bin"]: b["timesteps"] for b in result.get("bins", [])}
    best, best_key = None, None
    for t in trusted:
        cand = bins_at(runs, result["metric"], t, ks, ranges, analyze_metric, kw, gns_window) if ks else []
        n_ok = sum(1 for c in cand if c["entry"] is not None and not c["entry"]["flags"])
        key = (n_ok, -t["target"])
        if best_key is None or key > best_key:
            best, best_key = (t, cand), key
    answer = {"global": [t["target"] for t in trusted], "at_target": None, "bins": []}
    if best is not None:
        answer["at_target"] = best[0]["target"]
        answer["bins"] = best[1]
    answer["sentence"] = bins_sentence(answer["bins"], result.get("bootstrap", {}).get("level", 0.9))
    return answer


def trusted_bins(bins: list[dict]) -> list[dict]:
    return [
        b for b in bins if b["entry"] is not None and not b["entry"]["flags"] and None not in b["entry"]["b_crit_ci"]
    ]


def bins_sentence(bins: list[dict], level: float = 0.9) -> str:
    """One plain sentence on whether the trustworthy bins' B_crit differ beyond their intervals, and which way."""
    ok = trusted_bins(bins)
    pct = f"{100 * level:.0f}%"
    if len(ok) < 2:
        return (
            f"Too few timestep bins have a trustworthy B_crit ({len(ok)} of {len(bins)}) to compare them; "
            "see report.md for each bin's flags."
        )
    lo_b = min(ok, key=lambda b: b["entry"]["b_crit"])
    hi_b = max(ok, key=lambda b: b["entry"]["b_crit"])
    ratio = hi_b["entry"]["b_crit"] / lo_b["entry"]["b_crit"]

    def name(b):
        return f"t={b['timesteps'][0]}-{b['timesteps'][1]}"

    if hi_b["entry"]["b_crit_ci"][0] > lo_b["entry"]["b_crit_ci"][1]:
        return (
            f"Yes: B_crit differs across timesteps beyond the {pct} intervals -- it is {ratio:.2g}x larger at "
            f"{name(hi_b)} ({hi_b['entry']['b_crit']:.3g}) than at {name(lo_b)} ({lo_b['entry']['b_crit']:.3g}), "
            f"{len(ok)} of {len(bins)} bins trustworthy."
        )
    return (
        f"Not beyond the {pct} intervals: the trustworthy bins' B_crit range from {lo_b['entry']['b_crit']:.3g} "
        f"({name(lo_b)}) to {hi_b['entry']['b_crit']:.3g} ({name(hi_b)}), and their intervals overlap "
        f"({len(ok)} of {len(bins)} bins trustworthy)."
    )
