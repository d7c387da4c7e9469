"""A recommendation (analysis.features.recommend.recommend.Plan) as JSON, as a report section (in ``report.md``
too, and kept there when the sweep is analysed again), as terminal lines and as a figure; and ``bcrit recommend``'s
whole run on a sweep's runs (`run`: the recommendation at a target, its throughput model and the Pollux comparison
beside it, written)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from analysis.features.recommend import recommend, throughput
from analysis.features.recommend.recommend import Plan, RecommendError
from analysis.features.recommend.throughput import FEATURES
from analysis.reporting.html_report import HTML_FILE, render_html
from analysis.reporting.report import REPORT_FILE
from analysis.reporting.sweep_kind import check_metric
from analysis.reporting.trust_note import flags_at, untrusted_line
from analysis.sources.loaders import Runs

JSON_FILE = "recommend.json"
FIGURE = "recommend.png"
SECTION_FILE = "recommend.md"
SECTION_START = "<!-- bcrit recommend -->"
SECTION_END = "<!-- /bcrit recommend -->"


def _f(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def split_name(s) -> str:
    """``micro x A x W``, the sweep's own notation (``32x2x1``)."""
    return "x".join(str(int(v)) for v in s)


def to_json(p: Plan, extra: dict | None = None) -> dict:
    rows = []
    for i, s in enumerate(p.splits):
        rows.append(
            {
                "micro_batch_size": int(s[0]), "grad_accum": int(s[1]), "num_workers": int(s[2]),
                "batch_size": int(s.prod()), "steps": _f(p.steps[i]), "steps_ci": [_f(x) for x in p.steps_ci[i]],
                "step_seconds": _f(p.step_s[i]), "step_seconds_ci": [_f(x) for x in p.step_ci[i]],
                "time_s": _f(p.time_s[i]), "time_s_ci": [_f(x) for x in p.time_ci[i]],
                "cost_hours": _f(p.cost_h[i]), "cost_hours_ci": [_f(x) for x in p.cost_ci[i]],
                "peak_mem_gb": _f(p.mem_gb[i]), "measured": bool(p.measured[i]),
                "extrapolated": p.extrapolated[i], "excluded": p.excluded[i],
            }
        )  # fmt: skip
    out = {
        "metric": p.metric, "target": p.target, "cost_unit": p.unit, "level": p.level,
        "fastest": p.fastest, "cheapest": p.cheapest, "front": [int(i) for i in p.front],
        "device_mem_gb": p.device_mem_gb, "gpus_per_worker": p.gpus_per_worker,
        "candidates": rows, "notes": list(p.notes),
    }  # fmt: skip
    out.update(extra or {})
    return out


def _ci(lo_hi) -> str:
    lo, hi = lo_hi
    return "[–]" if not (np.isfinite(lo) and np.isfinite(hi)) else f"[{lo:.3g}, {hi:.3g}]"


def _row(p: Plan, i: int, role: str) -> str:
    mark = "measured" if p.measured[i] else "modelled"
    if p.extrapolated[i]:
        mark += f", extrapolated: {p.extrapolated[i]}"
    return (
        f"| {role} | {split_name(p.splits[i])} | {int(p.splits[i].prod())} | {p.steps[i]:.4g} {_ci(p.steps_ci[i])} | "
        f"{1000 * p.step_s[i]:.4g} {_ci(1000 * p.step_ci[i])} | {p.time_s[i]:.4g} {_ci(p.time_ci[i])} | "
        f"{p.cost_h[i]:.3g} {_ci(p.cost_ci[i])} | {mark} |"
    )


def table(p: Plan) -> list[str]:
    """The Pareto front (fastest first, cheapest last) as a markdown table."""
    pct = f"{100 * p.level:.0f}%"
    lines = [
        f"| | split micro x A x W | B | steps ({pct}) | ms/step ({pct}) | time-to-target s ({pct}) | {p.unit} ({pct}) "
        "| step time |",
        "|:---|:---:|---:|---:|---:|---:|---:|:---|",
    ]
    for i in p.front:
        role = " + ".join(r for r, j in (("fastest", p.fastest), ("cheapest", p.cheapest)) if j == i) or "front"
        lines.append(_row(p, int(i), role))
    return lines


def summary(p: Plan) -> list[str]:
    """What ``bcrit recommend`` prints first: the fastest and the cheapest in one line each."""

    def one(i: int) -> str:
        ex = " (extrapolated)" if p.extrapolated[i] else ""
        return (
            f"{split_name(p.splits[i])} (B={int(p.splits[i].prod())}): {p.time_s[i]:.3g} s {_ci(p.time_ci[i])}, "
            f"{p.cost_h[i]:.3g} {p.unit} {_ci(p.cost_ci[i])}{ex}"
        )

    return [
        f"to reach {p.metric} {p.target:.4g} ({100 * p.level:.0f}% intervals; micro x accumulation x workers):",
        f"  fastest:  {one(p.fastest)}",
        f"  cheapest: {one(p.cheapest)}",
    ]


def section(p: Plan, model_lines: list[str], pollux: list[str], warning: str | None = None) -> str:
    """The report.md section: the untrusted-B_crit warning if any, summary, front table, the throughput model,
    exclusions, the Pollux comparison."""
    excl = sorted({e for e in p.excluded if e})
    n_ex = sum(1 for e in p.excluded if e)
    lines = [
        SECTION_START,
        "## How should I train? (`bcrit recommend`)",
        "",
        *([f"**{warning}**", ""] if warning else []),
        *[f"    {s}" for s in summary(p)],
        "",
        f"{len(p.splits)} candidate splits, {int(p.measured.sum())} measured; time-to-target = steps S(B) of the fit "
        "at this target x seconds per step (training time: start-up and evaluation excluded); cost = time x workers. "
        "The Pareto front between the fastest and the cheapest (docs/recommend.md):",
        "",
        *table(p),
        "",
        *model_lines,
        *([""] + [f"- excluded ({n_ex}): {e}" for e in excl] if excl else []),
        *([""] + pollux if pollux else []),
        *([""] + [f"- {n}" for n in p.notes] if p.notes else []),
        "",
        f"![{FIGURE}]({FIGURE})",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


def section_in(report_md: str) -> str | None:
    """The recommendation section of ``report_md`` (markers included), None when it has none."""
    a, b = report_md.find(SECTION_START), report_md.find(SECTION_END)
    return report_md[a : b + len(SECTION_END)] + "\n" if a >= 0 and b > a else None


def replace_section(report_md: str, sec: str) -> str:
    """``report_md`` with its recommendation section replaced by ``sec`` (appended when it has none)."""
    a, b = report_md.find(SECTION_START), report_md.find(SECTION_END)
    if a >= 0 and b > a:
        return report_md[:a] + sec.rstrip("\n") + report_md[b + len(SECTION_END) :]
    return report_md.rstrip("\n") + "\n\n" + sec


def put_section(out: str, sec: str, metric: str) -> None:
    """The section ``sec`` into ``out``'s ``report.md`` (``report.html`` rendered again), when a report exists."""
    path = os.path.join(out, REPORT_FILE)
    if os.path.isfile(path):
        md = replace_section(open(path, encoding="utf-8").read(), sec)
        with open(path, "w", encoding="utf-8") as f:
            f.write(md)
        with open(os.path.join(out, HTML_FILE), "w", encoding="utf-8") as f:
            f.write(render_html(md, out, title=f"Critical batch size: {metric}"))


def carry_section(old: str, new: str, metric: str) -> None:
    """Carry the section of the report in ``old`` into the new report in ``new`` (with its figure, so that
    ``report.html`` embeds it): a re-analysis does not drop a recommendation (it stays until the next ``bcrit
    recommend`` replaces it)."""
    path = os.path.join(old, REPORT_FILE)
    if not (os.path.isfile(path) and os.path.isfile(os.path.join(new, REPORT_FILE))):
        return
    sec = section_in(open(path, encoding="utf-8").read())
    if sec is None:
        return
    if os.path.isfile(os.path.join(old, FIGURE)):
        shutil.copy2(os.path.join(old, FIGURE), os.path.join(new, FIGURE))
    put_section(new, sec, metric)


def figure(p: Plan, out: Path) -> Path:
    """Time vs cost of every eligible candidate, the front joined, extrapolated ones hollow, both axes log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = p.eligible
    ext = np.array([bool(e) for e in p.extrapolated])
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for sel, kw in (
        (ok & ~ext, dict(color="tab:blue", label="candidate")),
        (ok & ext, dict(facecolors="none", edgecolors="tab:blue", label="extrapolated")),
    ):
        if sel.any():
            ax.scatter(p.time_s[sel], p.cost_h[sel], s=28, **kw)
    f = p.front
    ax.plot(p.time_s[f], p.cost_h[f], "-", color="tab:red", lw=1.5, label="Pareto front")
    ax.errorbar(
        p.time_s[f], p.cost_h[f], xerr=np.abs(p.time_ci[f].T - p.time_s[f]), yerr=np.abs(p.cost_ci[f].T - p.cost_h[f]),
        fmt="o", color="tab:red", ms=5, capsize=2,
    )  # fmt: skip
    for i in f:
        ax.annotate(split_name(p.splits[i]), (p.time_s[i], p.cost_h[i]), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"time to {p.metric} {p.target:.4g} (training seconds)")
    ax.set_ylabel(p.unit)
    ax.set_title(
        f"micro x A x W: fastest {split_name(p.splits[p.fastest])}, cheapest {split_name(p.splits[p.cheapest])}"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / FIGURE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def check(runs: Runs, metric: str, target: float | None) -> None:
    """What the sweep must hold for a recommendation on ``metric`` (at ``target`` when given), before any fit."""
    if metric not in runs.metric_names():
        raise RecommendError(f"--metric {metric}: no trial reported it (have {runs.metric_names()[:6]} ...)")
    check_metric(runs, metric, None if target is None else [target], "--target", "the headline one")
    throughput.measured_splits(runs)  # a sweep without sys/ metrics: say so before the fit


def run(runs: Runs, target: float, how: str, metric: str, out: str, **plan) -> tuple[dict, list[str]]:
    """The recommendation at ``target`` (``how``: where the target came from) with ``plan``'s options
    (:func:`analysis.features.recommend.recommend.recommend`), written into ``out``; returns ``recommend.json``'s
    content and the lines ``bcrit recommend`` prints."""
    if (top := plan.get("max_batch")) is not None and top < int(runs.batch_size.min()):
        raise RecommendError(f"--max-batch {top}: no candidate split has a batch size <= {top}; raise it")
    p, fit, times = recommend.recommend(runs, target, metric, **plan)
    pollux = pollux_lines(runs, metric, fit, p)
    model = throughput.fit_step_time(times.splits, times.step_s)
    flags = flags_at(runs, metric, target)
    warning = untrusted_line({float(target): flags}, "this recommendation")
    rec = to_json(p, {"target_from": how, "throughput_model": model_json(model, times), "pollux": pollux[1],
                      "flags": flags, "warning": warning})  # fmt: skip
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, JSON_FILE), "w", encoding="utf-8") as f:
        f.write(json.dumps(rec, indent=1, allow_nan=False) + "\n")
    figure(p, Path(out))
    sec = section(p, model_lines(model, times), pollux[0], warning)
    with open(os.path.join(out, SECTION_FILE), "w", encoding="utf-8") as f:
        f.write(sec)
    put_section(out, sec, metric)
    excluded = sorted({e for e in p.excluded if e})
    lines = [
        *([warning] if warning else []),
        f"target: {metric} {target:.4g} ({how})",
        *summary(p),
        *table(p),
        model_lines(model, times)[0].replace("`", "").rstrip(":") + "; per split in recommend.md",
        *pollux[0],
        *[f"- excluded: {e}" for e in excluded],
        *[f"- {n}" for n in p.notes],
    ]
    return rec, lines


def model_json(model, times) -> dict:
    return {
        "coef": dict(zip(FEATURES, [float(c) for c in model.coef], strict=True)),
        "rank": model.rank,
        "rms_log": model.rms_log,
        "splits": [{"split": [int(x) for x in s], "step_s": float(t), "residual_log": float(r), "trials": int(n)}
                   for s, t, r, n in zip(times.splits, times.step_s, model.residual_log, times.n_trials, strict=True)],
    }  # fmt: skip


def model_lines(model, times) -> list[str]:
    """The throughput model's fit and residuals, for the report."""
    g, a, b, k = model.coef
    lines = [
        f"Step time model `T = γ + A·(α + β·micro) + κ·2(W-1)/W`: γ = {1000 * g:.3g} ms, α = {1000 * a:.3g} ms, "
        f"β = {1000 * b:.3g} ms/example, κ = {1000 * k:.3g} ms (rank {model.rank} of 4; rms log residual "
        f"{model.rms_log:.3g}):",
        "",
        "| split | trials | measured ms/step | model ms/step | residual (log) |",
        "|:---:|---:|---:|---:|---:|",
    ]
    fitted = model.predict(times.splits)
    for s, n, t, f, r in zip(times.splits, times.n_trials, times.step_s, fitted, model.residual_log, strict=True):
        lines.append(f"| {split_name(s)} | {n} | {1000 * t:.4g} | {1000 * f:.4g} | {r:+.3f} |")
    return lines


def pollux_lines(runs, metric: str, fit, p) -> tuple[list[str], dict | None]:
    """Pollux's goodput optimum from the same sweep's B_simple, beside the recommendation."""
    bs = recommend.b_simple_at_target(runs, metric, fit.target)
    if bs is None:
        return ["- Pollux comparison: no B_simple logged at this target (gns/ metrics missing)"], None
    j = recommend.pollux_choice(p, bs)
    t_pollux = recommend.pollux_times(fit, bs, p.batch_size[[j]], p.step_s[[j]])[0]
    same = j == p.fastest
    line = (
        f"- Pollux (goodput with φ = B_simple = {bs:.3g} at this target, vs B_crit = {fit.e_min / fit.s_min:.3g}) "
        "picks "
        f"{split_name(p.splits[j])}: " + ("the same as the fastest." if same else
        f"its predicted time here {p.time_s[j]:.3g} s (Pollux's own model says {t_pollux:.3g} s) vs the fastest's "
        f"{p.time_s[p.fastest]:.3g} s.")
    )  # fmt: skip
    return [line], {"b_simple": bs, "choice": j, "same_as_fastest": bool(same), "pollux_model_time_s": float(t_pollux)}
