"""From runs to the answer: ``bcrit.json``, plots, a one-page ``report.md`` and ``report.html`` (plots embedded),
and the sweep's MLflow parent run (analysis.reporting.publish).

Pipeline per metric (McCandlish et al. 2018; Shallue et al. 2018):
1. steps-to-target of every trial for every target (interpolated, censored = never reached);
2. best trial per batch size (nuisance hyper-parameters tuned), diverged/failed trials excluded, the splits of one
   (batch size, setting, seed) pooled into one repeat (analysis.fits.steps.pool_splits);
3. log-space Pareto fit ``S = S_min + E_min/B`` → ``B_crit = E_min/S_min``;
4. percentile bootstrap over seeds (or trials, with one seed per setting), the points' scatter about the fit beyond
   what the replicates show added (analysis.fits.pareto.lack_of_fit_var) → ``b_crit_ci``;
5. the same on ``eval/loss/bin{k}`` per timestep bin, with ``B_simple`` ± SE at the crossings beside it (the
   fitted trials' windows pooled, analysis.fits.gns_view.pooled_b_simple).

``bcrit analyze`` writes the outputs into a private directory (`staging_dir`), then moves them into the output
directory file by file (`publish`, ``os.replace``): a killed run leaves no partial file, and two runs on one sweep
both finish with whole, identical files.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from analysis.core import metrics as m
from analysis.core.bins import timestep_bins
from analysis.features.adaptive import adaptive_report
from analysis.fits import answer, gns_view, pareto
from analysis.fits import flags as fl
from analysis.fits.band import bands_between
from analysis.fits.steps import (
    excluded_counts,
)
from analysis.fits.sweep_fit import analyze_metric
from analysis.fits.trust import headline
from analysis.reporting.html_report import HTML_FILE, render_html
from analysis.sources.loaders import Runs

JSON_FILE = "bcrit.json"
REPORT_FILE = "report.md"


def analyze(
    runs: Runs,
    metric: str = m.EVAL_LOSS,
    targets: list[float] | None = None,
    out_dir: str | Path | None = None,
    *,
    bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.9,
    n_targets: int = 8,
    num_timesteps: int = 1000,
    gns_window: int | None = None,
    plots: bool = True,
    calibrate: bool = True,
) -> dict:
    """Analyse a sweep; with ``out_dir`` write ``bcrit.json``, the PNG plots and ``report.md`` there.

    Per-bin targets are always spread automatically (per-bin losses have their own scales); bins whose targets
    fewer than 3 batch sizes reach are skipped with a note. Bin ``k`` of ``K`` covers
    ``analysis.core.bins.timestep_bins(K, num_timesteps)[k]``.
    """
    notes: list[str] = []
    kw = dict(bootstrap=bootstrap, seed=seed, level=level, n_targets=n_targets, calibrate=calibrate)
    result: dict = {"metric": metric, "targets": analyze_metric(runs, metric, targets, **kw)}
    gns_view.attach_b_simple(runs, result["targets"], None, gns_window)
    result["bands"] = bands_between(runs, metric, result["targets"], bootstrap, seed, level, notes)
    ks = gns_view.bins_in(runs, m.EVAL_LOSS + "/")
    ranges = timestep_bins(max(ks) + 1, num_timesteps) if ks else []
    result["bins"] = []
    for k in ks:
        try:
            tg = analyze_metric(runs, m.per_bin(m.EVAL_LOSS_BIN, k), None, strict=False, notes=notes, **kw)
        except pareto.TooFewBatchSizesError as e:
            notes.append(f"bin {k}: {e}")
            continue
        gns_view.attach_b_simple(runs, tg, k, gns_window)
        result["bins"].append({"bin": k, "timesteps": list(ranges[k]), "targets": tg})
    result["answer"] = answer.build(runs, result, analyze_metric, kw, gns_window)
    result["excluded"] = excluded_counts(runs)
    result["n_trials"] = len(runs.trial_ids)
    result["bootstrap"] = {"replicates": bootstrap, "level": level, "seed": seed}
    result["source"] = runs.source
    result["notes"] = notes
    design = adaptive_report.load_decisions(runs.source) if runs.source else None
    if design is not None:
        result["adaptive"] = design
    if out_dir is not None:
        write_outputs(result, runs, Path(out_dir), plots=plots, gns_window=gns_window)
    return result


def write_outputs(result: dict, runs: Runs, out: Path, plots: bool = True, gns_window: int | None = None) -> list[Path]:
    """Write ``bcrit.json``, the plots (optional) and ``report.md``; return the written paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / JSON_FILE]
    paths[0].write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    pngs: list[Path] = []
    if plots:
        from analysis.reporting import plots as pl

        pngs = pl.make_all(result, runs, out, gns_window=gns_window)
    md = render_markdown(result, [p.name for p in pngs])
    (out / REPORT_FILE).write_text(md)

    (out / HTML_FILE).write_text(render_html(md, out, title=f"Critical batch size: {result['metric']}"))
    return [*paths, *pngs, out / REPORT_FILE, out / HTML_FILE]


@contextlib.contextmanager
def staging_dir(out: str):
    """A private directory next to the outputs (same file system), removed afterwards: the results are written
    there in full, then `publish`-ed, so a killed or concurrent run never leaves a partial ``bcrit.json``."""
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".partial-", dir=out)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: str, out: str, last: str) -> None:
    """Move every file of ``tmp`` into ``out`` with ``os.replace`` (atomic per file), ``last`` after the others
    so that a ``bcrit.json`` newer than the other files never exists."""
    names = sorted(n for n in os.listdir(tmp) if os.path.isfile(os.path.join(tmp, n)))
    for name in [n for n in names if n != last] + [n for n in names if n == last]:
        os.replace(os.path.join(tmp, name), os.path.join(out, name))


def cell_num(x: float | None) -> str:
    """A number in 4 significant digits for report tables (a dash when missing)."""
    return "–" if x is None else f"{x:.4g}"


def pm_cell(x: float | None, se: float | None) -> str:
    """``x ± se`` for report tables (``x`` alone without an SE, a dash when missing)."""
    return cell_num(x) if se is None or x is None else f"{x:.4g} ± {se:.2g}"


def _target_row(t: dict) -> str:
    lo, hi = t["b_crit_ci"]
    return (
        f"| {t['target']:.4g} | {t['b_crit']:.4g} | [{cell_num(lo)}, {cell_num(hi)}] {t.get('ci_resamples', '')} | "
        f"{cell_num(t.get('b_crit_refined'))} | {t['s_min']:.4g} | {t['e_min']:.4g} | {len(t['points'])} | "
        f"{len(t['censored'])} | {pm_cell(t.get('b_simple'), t.get('b_simple_se'))} |"
    )


def render_markdown(result: dict, pngs: list[str]) -> str:
    """One page: the trustworthy targets' B_crit, then the flagged ones with their flags, exclusions, per-bin
    summary (medians over trustworthy targets) and the plots."""
    ex = result["excluded"]
    head = headline(result["targets"])
    level = f"{100 * result['bootstrap']['level']:.0f}%"
    lines = [
        f"# Critical batch size: `{result['metric']}`",
        "",
        *([f"- {a}" for a in answer_lines(result)] + [""] if head else []),
        f"Source: `{result['source']}` · {result['n_trials']} trials · excluded: "
        + ", ".join(f"{v} {k}" for k, v in ex.items())
        + f" · bootstrap: {result['bootstrap']['replicates']} replicates, {level} interval.",
        "",
        "Fit `S = S_min + E_min/B` in log space, `B_crit = E_min/S_min` (McCandlish et al. 2018, arXiv 1812.06162).",
        "Trustworthy targets (no flags); the interval resamples `seeds` (within each nuisance setting) or `trials` "
        "(one seed per setting: seed-to-seed noise not included). `refined`: B_crit with each batch size's optimum "
        "interpolated between learning-rate grid points (a parabola in log-lr), beside the plain grid minimum.",
        "",
    ]
    table = [
        f"| target | B_crit | {level} interval, resamples | refined | S_min (steps) | E_min (examples) | batch sizes "
        "| censored trials | B_simple ± SE |",
        "|---:|---:|:---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += table + [_target_row(t) for t in head] if head else ["**No trustworthy target**: see the flags below."]
    flagged = [t for t in result["targets"] if t.get("flags")]
    if flagged:
        lines += ["", "Flagged targets (not in the headline; docs/analysis.md: how to read the flags):", ""]
        lines += ["| target | B_crit | interval | flags | censored batch sizes |", "|---:|---:|:---:|:---|:---|"]
        for t in flagged:
            lo, hi = t["b_crit_ci"]
            cens = "; ".join(f"B={c['batch_size']}: {c['reason']}" for c in t.get("censored_batch_sizes", []))
            lines.append(
                f"| {t['target']:.4g} | {t['b_crit']:.4g} | [{cell_num(lo)}, {cell_num(hi)}] | "
                f"{', '.join(f'`{f}`' for f in t['flags'])} | {cens or '–'} |"
            )
        seen = sorted({f for t in flagged for f in t["flags"]}, key=fl.FLAGS.index)
        lines += [""] + [f"- `{f}`: {fl.FLAG_DOCS[f][0]}. Fix: {fl.FLAG_DOCS[f][1]}." for f in seen]
    if result.get("bands"):
        lines += [
            "",
            "B_crit along training: the band between consecutive targets (`ΔS = ΔS_min + ΔE_min/B` from the same "
            "trials; the targets' B_crit above count every step from the start, a band only its own stretch; "
            "analysis/fits/band.py):",
            "",
            f"| band (loss) | B_crit of the band | {level} interval | ΔS_min (steps) | ΔE_min (examples) | flags |",
            "|:---:|---:|:---:|---:|---:|:---|",
        ]
        for bd in result["bands"]:
            lo, hi = bd["b_crit_ci"]
            lines.append(
                f"| {bd['hi']:.4g} → {bd['lo']:.4g} | {bd['b_crit']:.4g} | [{cell_num(lo)}, {cell_num(hi)}] | "
                f"{bd['s_min']:.4g} | {bd['e_min']:.4g} | {', '.join(f'`{f}`' for f in bd['flags']) or '–'} |"
            )
    if result["bins"]:
        lines += ["", "Per timestep bin (median over trustworthy targets): ", ""]
        lines += ["| bin | timesteps | B_crit | B_simple | trustworthy targets |", "|---:|:---:|---:|---:|---:|"]
        for b in result["bins"]:
            ok = headline(b["targets"])
            bc = [t["b_crit"] for t in ok]
            gs = [t["b_simple"] for t in ok if t.get("b_simple") is not None]
            lo, hi = b["timesteps"]
            med_bs = cell_num(float(np.median(gs))) if gs else "–"
            lines.append(
                f"| {b['bin']} | {lo}–{hi} | {cell_num(float(np.median(bc)) if bc else None)} | {med_bs} | "
                f"{len(ok)} of {len(b['targets'])} |"
            )
    if result["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in result["notes"]]
    if result.get("adaptive"):
        lines += adaptive_report.markdown_lines(result["adaptive"])
    lines += [""] + [f"![{p}]({p})" for p in pngs]
    return "\n".join(lines) + "\n"


def summary_lines(result: dict) -> list[str]:
    """What ``bcrit analyze`` prints: one line per target (flags named), then the headline over trustworthy ones."""
    out = []
    for t in result["targets"]:
        lo, hi = t["b_crit_ci"]
        level = round(100 * result.get("bootstrap", {}).get("level", 0.9))
        mark = f"  FLAGGED: {', '.join(t['flags'])}" if t.get("flags") else ""
        out.append(
            f"target {t['target']:.4g}: B_crit = {short_num(t['b_crit'])}  {level}% CI "
            f"[{short_num(lo)}, {short_num(hi)}] "
            f"over {t.get('ci_resamples', 'trials')}  ({len(t['points'])} batch sizes){mark}"
        )
    bands = result.get("bands", [])
    if bands:
        out.append(
            "along training (B_crit of each band between targets): "
            + ", ".join(
                f"{b['hi']:.4g}->{b['lo']:.4g} {short_num(b['b_crit'])}" + ("*" if b["flags"] else "") for b in bands
            )
            + ("  (* flagged)" if any(b["flags"] for b in bands) else "")
        )
    head = headline(result["targets"])
    if head:
        vals = ", ".join(f"{short_num(t['b_crit'])} at {t['target']:.4g}" for t in head)
        out.append(f"headline: B_crit {vals} ({len(head)} of {len(result['targets'])} targets trustworthy)")
    else:
        out.append("headline: no trustworthy target (every target is flagged; see report.md and docs/analysis.md)")
    return out


def answer_lines(result: dict) -> list[str]:
    """The answer to both halves of the question (analysis.fits.answer): global B_crit with intervals at the
    trustworthy targets, then B_crit and B_simple per timestep bin at one common point of training, then the
    sentence. Empty when no target is trustworthy (the headline line says so)."""
    ans = result.get("answer") or {}
    head = headline(result["targets"])
    if not head:
        return []
    level = f"{100 * result.get('bootstrap', {}).get('level', 0.9):.0f}%"
    over = head[0].get("ci_resamples", "trials")
    vals = "; ".join(
        f"{short_num(t['b_crit'])} [{short_num(t['b_crit_ci'][0])}, {short_num(t['b_crit_ci'][1])}] at "
        f"{result['metric']} {t['target']:.4g}"
        for t in head
    )
    out = [f"answer: B_crit = {vals}  ({level} intervals over {over})"]
    if ans.get("bins"):
        cells = []
        for b in ans["bins"]:
            e, (lo, hi) = b["entry"], b["timesteps"]
            if e is None:
                cells.append(f"t={lo}-{hi}: not reached by 3 batch sizes")
                continue
            ci = f"[{short_num(e['b_crit_ci'][0])}, {short_num(e['b_crit_ci'][1])}]"
            flag = f" FLAGGED: {', '.join(e['flags'])}" if e["flags"] else ""
            bs = pm_num(e.get("b_simple"), e.get("b_simple_se"))
            cells.append(f"t={lo}-{hi}: B_crit {short_num(e['b_crit'])} {ci}, B_simple {bs}{flag}")
        out.append(f"per timestep bin, where {result['metric']} reaches {ans['at_target']:.4g}: " + "; ".join(cells))
        out.append(ans["sentence"])
    return out


def short_num(x: float | None) -> str:
    """A B_crit-like number in 3 significant digits for terminal lines (``n/a`` when missing)."""
    return "n/a" if x is None else f"{x:.3g}"


def pm_num(x: float | None, se: float | None) -> str:
    """``x ± se`` in 3 significant digits (``x`` alone without an SE, ``n/a`` when missing)."""
    return short_num(x) if se is None or x is None else f"{x:.3g} ± {se:.2g}"
