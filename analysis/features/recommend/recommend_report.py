"""A recommendation (analysis.features.recommend.recommend.Plan) as JSON, as a report section, as terminal lines and as
a figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis.features.recommend.recommend import Plan

JSON_FILE = "recommend.json"
FIGURE = "recommend.png"
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
