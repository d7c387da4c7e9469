"""From runs to the answer: ``bcrit.json``, plots, a one-page ``report.md`` and ``report.html`` (plots embedded),
and the sweep's MLflow parent run (analysis.publish).

Pipeline per metric (McCandlish et al. 2018; Shallue et al. 2018):
1. steps-to-target of every trial for every target (interpolated, censored = never reached);
2. best trial per batch size (nuisance hyper-parameters tuned), diverged/failed trials excluded;
3. log-space Pareto fit ``S = S_min + E_min/B`` → ``B_crit = E_min/S_min``;
4. percentile bootstrap over trials → ``b_crit_ci``;
5. the same on ``eval/loss/bin{k}`` per timestep bin, with ``B_simple`` at each crossing beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from analysis import gns_view, pareto
from analysis import metrics as m
from analysis.bins import timestep_bins
from analysis.loaders import Runs
from analysis.steps import best_per_batch, excluded_counts, final_losses, steps_to_target, usable

JSON_FILE = "bcrit.json"
REPORT_FILE = "report.md"


def analyze_metric(
    runs: Runs,
    metric: str,
    targets: list[float] | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.9,
    n_targets: int = 8,
    strict: bool = True,
    notes: list[str] | None = None,
) -> list[dict]:
    """Per target: ``{"target", "b_crit", "b_crit_ci", "s_min", "e_min", "points", "censored"}``.

    ``strict``: a target reached by fewer than 3 batch sizes raises :class:`pareto.TooFewBatchSizesError`;
    otherwise it is skipped with a line in ``notes``.
    """
    series = runs.series(metric)
    n = len(runs.trial_ids)
    ok, bs = usable(runs), runs.batch_size
    if len(series.trial) == 0:
        raise pareto.TooFewBatchSizesError(f"no trial reported {metric!r} (have {runs.metric_names()[:8]})")
    if targets is None:
        targets = list(pareto.auto_targets(bs, ok, *final_losses(series, n), n=n_targets))
    steps = steps_to_target(series, n, targets)  # (T, n)
    steps[:, ~ok] = np.nan
    rng = np.random.default_rng(seed)
    boot_bs, boot = pareto.bootstrap_best(steps, bs, ok, bootstrap, rng) if bootstrap > 0 else (None, None)
    out = []
    for j, y in enumerate(targets):
        best = best_per_batch(steps[j], bs, ok)
        try:
            pareto.check_enough(float(y), metric, best.batch_sizes, best.steps)
        except pareto.TooFewBatchSizesError as e:
            if strict:
                raise
            (notes if notes is not None else []).append(str(e))
            continue
        fit = pareto.fit_pareto(best.batch_sizes, best.steps)
        ci = (float("nan"), float("nan"))
        if boot is not None:
            p0 = np.log([fit.s_min, fit.e_min])
            s_min, e_min = pareto.fit_pareto_batched(boot_bs, boot[j], p0)
            ci = pareto.percentile_ci(e_min / s_min, level)
        reached = np.isfinite(best.steps)
        out.append(
            {
                "target": float(y),
                "b_crit": fit.b_crit,
                "b_crit_ci": [_num(ci[0]), _num(ci[1])],
                "s_min": fit.s_min,
                "e_min": fit.e_min,
                "points": [
                    {"batch_size": int(b), "steps": float(s), "trial_id": runs.trial_ids[r]}
                    for b, s, r in zip(best.batch_sizes[reached], best.steps[reached], best.trial[reached], strict=True)
                ],
                "censored": [runs.trial_ids[r] for r in np.flatnonzero(ok & np.isinf(steps[j]))],
            }
        )
    return out


def _num(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


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
    gns_beta: float = 0.99,
    plots: bool = True,
) -> dict:
    """Analyse a sweep; with ``out_dir`` write ``bcrit.json``, the PNG plots and ``report.md`` there.

    Per-bin targets are always spread automatically (per-bin losses have their own scales); bins whose targets
    fewer than 3 batch sizes reach are skipped with a note. Bin ``k`` of ``K`` covers
    ``analysis.bins.timestep_bins(K, num_timesteps)[k]``.
    """
    notes: list[str] = []
    kw = dict(bootstrap=bootstrap, seed=seed, level=level, n_targets=n_targets)
    result: dict = {"metric": metric, "targets": analyze_metric(runs, metric, targets, **kw)}
    gns_view.attach_b_simple(runs, result["targets"], None, gns_beta)
    ks = gns_view.bins_in(runs, m.EVAL_LOSS + "/")
    ranges = timestep_bins(max(ks) + 1, num_timesteps) if ks else []
    result["bins"] = []
    for k in ks:
        try:
            tg = analyze_metric(runs, m.per_bin(m.EVAL_LOSS_BIN, k), None, strict=False, notes=notes, **kw)
        except pareto.TooFewBatchSizesError as e:
            notes.append(f"bin {k}: {e}")
            continue
        gns_view.attach_b_simple(runs, tg, k, gns_beta)
        result["bins"].append({"bin": k, "timesteps": list(ranges[k]), "targets": tg})
    result["excluded"] = excluded_counts(runs)
    result["n_trials"] = len(runs.trial_ids)
    result["bootstrap"] = {"replicates": bootstrap, "level": level, "seed": seed}
    result["source"] = runs.source
    result["notes"] = notes
    if out_dir is not None:
        write_outputs(result, runs, Path(out_dir), plots=plots, gns_beta=gns_beta)
    return result


def write_outputs(result: dict, runs: Runs, out: Path, plots: bool = True, gns_beta: float = 0.99) -> list[Path]:
    """Write ``bcrit.json``, the plots (optional) and ``report.md``; return the written paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / JSON_FILE]
    paths[0].write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    pngs: list[Path] = []
    if plots:
        from analysis import plots as pl

        pngs = pl.make_all(result, runs, out, gns_beta=gns_beta)
    md = render_markdown(result, [p.name for p in pngs])
    (out / REPORT_FILE).write_text(md)
    from analysis.html_report import HTML_FILE, render_html

    (out / HTML_FILE).write_text(render_html(md, out, title=f"Critical batch size: {result['metric']}"))
    return [*paths, *pngs, out / REPORT_FILE, out / HTML_FILE]


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def render_markdown(result: dict, pngs: list[str]) -> str:
    """One page: the B_crit table per target, exclusions, per-bin summary and the plots."""
    ex = result["excluded"]
    lines = [
        f"# Critical batch size: `{result['metric']}`",
        "",
        f"Source: `{result['source']}` · {result['n_trials']} trials · excluded: "
        + ", ".join(f"{v} {k}" for k, v in ex.items())
        + f" · bootstrap: {result['bootstrap']['replicates']} replicates, "
        f"{100 * result['bootstrap']['level']:.0f}% interval.",
        "",
        "Fit `S = S_min + E_min/B` in log space, `B_crit = E_min/S_min` (McCandlish et al. 2018, arXiv 1812.06162).",
        "",
        "| target | B_crit | interval | S_min (steps) | E_min (examples) | batch sizes | censored | B_simple |",
        "|---:|---:|:---:|---:|---:|---:|---:|---:|",
    ]
    for t in result["targets"]:
        lo, hi = t["b_crit_ci"]
        lines.append(
            f"| {t['target']:.4g} | {t['b_crit']:.4g} | [{_fmt(lo)}, {_fmt(hi)}] | {t['s_min']:.4g} | "
            f"{t['e_min']:.4g} | {len(t['points'])} | {len(t['censored'])} | {_fmt(t.get('b_simple'))} |"
        )
    if result["bins"]:
        lines += ["", "Per timestep bin (median over targets): ", ""]
        lines += ["| bin | timesteps | B_crit | B_simple |", "|---:|:---:|---:|---:|"]
        for b in result["bins"]:
            bc = [t["b_crit"] for t in b["targets"]]
            gs = [t["b_simple"] for t in b["targets"] if t.get("b_simple") is not None]
            lo, hi = b["timesteps"]
            med_bs = _fmt(float(np.median(gs))) if gs else "–"
            lines.append(f"| {b['bin']} | {lo}–{hi} | {_fmt(float(np.median(bc)) if bc else None)} | {med_bs} |")
    if result["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in result["notes"]]
    lines += [""] + [f"![{p}]({p})" for p in pngs]
    return "\n".join(lines) + "\n"


def log_to_mlflow(out_dir: str | Path, tracking_uri: str | None, parent_run_id: str) -> None:
    """Log the analysis to the sweep's parent run: every file of ``out_dir`` as artifacts under ``analysis/``,
    the headline per target as metrics and as an MLflow table, the report's first lines as its description
    (analysis.publish)."""
    from analysis.publish import log_analysis

    log_analysis(out_dir, tracking_uri, parent_run_id)
