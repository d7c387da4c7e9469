"""The samplers' comparison (``analysis.features.allocation.allocation_report.compare``) as a markdown section, a
figure, and an addition
to ``bcrit analyze``'s report (docs/allocation.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from analysis.features.allocation.allocation_report import compare
from analysis.reporting.html_report import HTML_FILE, render_html
from analysis.reporting.report import REPORT_FILE
from analysis.sources.loaders import Runs, samplers_of


def _n(x, se=None) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.3g}" if se is None or not math.isfinite(se) else f"{x:.3g} ± {se:.2g}"


def render_markdown(result: dict, png: str | None = None) -> str:
    """The comparison as markdown: per-bin table, per-allocation prediction, predicted vs measured ratios."""
    lines = [f"## Timestep allocation at eval/loss {result['target']:g}", ""]
    if result.get("warning"):
        lines += [f"**{result['warning']}**", ""]
    pred = result["predicted"]
    if result["bins"]:
        names = list(pred["allocations"])
        lines += ["| bin | timesteps | B_simple (uniform, last window) | B_crit (uniform, bin target) | "
                  + " | ".join(f"p ({n})" for n in names) + " |",
                  "| --- | --- | --- | --- | " + " | ".join("---" for _ in names) + " |"]  # fmt: skip
        for r in result["bins"]:
            cells = " | ".join(f"{r['p'][n]:.3f}" for n in names)
            bc = f"{_n(r['b_crit'])} (at {r['b_crit_target']:.3g})" if r.get("b_crit") is not None else "–"
            span = f"{r['timesteps'][0]}-{r['timesteps'][1]}"
            lines.append(f"| {r['bin']} | {span} | {_n(r['b_simple'])} | {bc} | {cells} |")
        lines.append("")
    if pred is not None:
        lines += [f"Predicted from {len(pred['trials'])} uniform trial(s) (window at the target):", "",
                  "| allocation | tr Sigma per example | B_simple | "
                  + " | ".join(f"S/S_uniform B={b}" for b in result["batch_sizes"]) + " |",
                  "| --- | --- | --- | " + " | ".join("---" for _ in result["batch_sizes"]) + " |"]  # fmt: skip
        for name, a in pred["allocations"].items():
            ratios = " | ".join(_n(r, s) for r, s in zip(a["ratio"], a["ratio_se"], strict=True))
            lines.append(
                f"| {name} | {_n(a['trace'], a['trace_se'])} | {_n(a['b_simple'], a['b_simple_se'])} | {ratios} |"
            )
        lines.append("")
    lines += ["| sampler | B_crit | interval | measured B_simple | "
              + " | ".join(f"steps B={b}" for b in result["batch_sizes"]) + " |",
              "| --- | --- | --- | --- | " + " | ".join("---" for _ in result["batch_sizes"]) + " |"]  # fmt: skip
    for name, m in result["measured"].items():
        bs = _n(m.get("b_simple"), m.get("b_simple_se"))
        if "error" in m:
            lines.append(
                f"| {name} | – | {m['error']} | {bs} | " + " | ".join("–" for _ in result["batch_sizes"]) + " |"
            )
            continue
        steps = " | ".join(_n(m["points"].get(b, {}).get("steps")) for b in result["batch_sizes"])
        ci = m["b_crit_ci"]
        lines.append(f"| {name} | {_n(m['b_crit'])} | [{_n(ci[0])}, {_n(ci[1])}] | {bs} | {steps} |")
    if result["ratios"]:
        lines += ["", "| sampler | B | measured S/S_uniform | predicted S/S_uniform |", "| --- | --- | --- | --- |"]
    for r in result["ratios"]:
        pred_cell = _n(r.get("predicted"), r.get("predicted_se"))
        how = f" ({r['pairs']} pairs)" if "pairs" in r else ""
        lines.append(
            f"| {r['sampler']} | {r['batch_size']} | {_n(r['measured'], r['measured_se'])}{how} | {pred_cell} |"
        )
    if png:
        lines += ["", f"![predicted vs measured steps ratio]({png})"]
    lines += [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def plot(result: dict, path) -> None:
    """Measured (points, seeds' SE) vs predicted (lines, delta-method band) ``S/S_uniform`` against B."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, name in enumerate(sorted({r["sampler"] for r in result["ratios"]})):
        rows = [r for r in result["ratios"] if r["sampler"] == name]
        b = np.array([r["batch_size"] for r in rows], float)
        color = f"C{i}"
        ax.errorbar(b, [r["measured"] for r in rows], yerr=[r["measured_se"] for r in rows], fmt="o", color=color,
                    label=f"{name}: measured")  # fmt: skip
        if all("predicted" in r for r in rows):
            y, s = np.array([r["predicted"] for r in rows]), np.array([r["predicted_se"] for r in rows])
            ax.plot(b, y, "-", color=color, label=f"{name}: predicted")
            ax.fill_between(b, y - s, y + s, color=color, alpha=0.2)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("steps to target / uniform's")
    ax.set_title(f"eval/loss {result['target']:g}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_to_report(bcrit: dict, runs: Runs, out_dir, bootstrap: int = 200) -> dict | None:
    """For a sweep that compared samplers: the comparison at the report's first target, with each bin's empirical
    B_crit (``bcrit["bins"]``, from the uniform trials) in the per-bin table, appended to ``report.md`` with its
    figure, and ``report.html`` rendered again; ``allocation.json`` beside them. None for a one-sampler sweep."""
    if len(set(samplers_of(runs))) < 2 or not bcrit["targets"]:
        return None
    out = Path(out_dir)
    result = compare(runs, float(bcrit["targets"][0]["target"]), bootstrap=bootstrap)
    b_crit = {b["bin"]: b["targets"][len(b["targets"]) // 2] for b in bcrit.get("bins", []) if b["targets"]}
    for row in result["bins"]:
        t = b_crit.get(row["bin"])
        row["b_crit"], row["b_crit_target"] = (t["b_crit"], t["target"]) if t else (None, None)
    png = "allocation.png" if result["ratios"] else None
    if png:
        plot(result, out / png)
    md = (out / REPORT_FILE).read_text() + "\n" + render_markdown(result, png)
    (out / REPORT_FILE).write_text(md)
    (out / HTML_FILE).write_text(render_html(md, out, title=f"Critical batch size: {bcrit['metric']}"))
    (out / "allocation.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    return result
