"""``bcrit analyze`` on a branched study's directory: ``bcrit.json``, ``report.md`` and ``branched.png``.

The settings (tolerances ``ε``, comparator, smoothing window, ``Δ``) are the study's own, saved by ``bcrit branch``
in :data:`analysis.sources.schema.BRANCH_SETTINGS_FILE`; without that file the defaults of
:func:`analysis.features.branched.branched.analyze`.
The plot puts the branched critical batch size over training progress (the reference's examples) beside the
reference's live ``B_simple`` (re-smoothed from its logged gradient statistics), globally and per timestep bin.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from analysis.features.branched import branched as branch
from analysis.fits import gns_view
from analysis.reporting.report import cell_num, short_num
from analysis.sources.loaders import Runs
from analysis.sources.schema import BRANCH_SETTINGS_FILE, RunsTableError

JSON_FILE, REPORT_FILE, PLOT_FILE = "bcrit.json", "report.md", "branched.png"


def settings(runs: Runs) -> dict:
    """The study's analysis settings from its directory (``{}`` when not saved there), or, for a study read from
    MLflow, from the parent run's artifact of the same name (an error when it has none)."""
    if runs.source.startswith("mlflow:"):
        saved = _mlflow_settings(runs)
    else:
        path = Path(runs.source) / BRANCH_SETTINGS_FILE if runs.source else None
        if path is None or not path.is_file():
            return {}
        try:
            saved = json.loads(path.read_text())
        except ValueError:
            raise RunsTableError(f"{path}: not valid JSON; delete it to analyse with the default settings") from None
    return {k: saved[k] for k in ("epsilons", "compare", "window", "delta") if k in saved}


def _mlflow_settings(runs: Runs) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(runs.tracking_uri)
    try:
        text = client.download_artifacts(runs.parent_run_id, BRANCH_SETTINGS_FILE)
        return json.loads(Path(text).read_text())
    except Exception:  # noqa: BLE001 - absent artifact (MLflow raises several types) or bad JSON
        raise RunsTableError(
            f"MLflow run {runs.parent_run_id} holds a branched study without its settings "
            f"(artifact {BRANCH_SETTINGS_FILE}); analyse its directory instead: bcrit analyze STUDY_DIR"
        ) from None


def analyze(runs: Runs, out_dir: str | Path | None = None, *, bootstrap: int = 200, seed: int = 0, plots=True) -> dict:
    kw = settings(runs)
    result = branch.analyze(runs, bootstrap=bootstrap, seed=seed, **kw)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / JSON_FILE).write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
        pngs = [plot(result, runs, out / PLOT_FILE).name] if plots else []
        (out / REPORT_FILE).write_text(render_markdown(result, pngs))
    return result


def _answer(a: dict) -> str:
    v = cell_num(a["b_crit"])
    return {"lower": f"≥ {v}", "upper": f"≤ {v}"}.get(a["bound"], v)


def summary_lines(result: dict) -> list[str]:
    """What ``bcrit analyze`` prints of a branched study: per branch point, B_crit at the first tolerance."""
    eps = result["epsilons"][0]
    lines = []
    for p in result["points"]:
        a = p["by_epsilon"][0]
        lo, hi = a["b_crit_ci"]
        lines.append(
            f"step {p['branch_step']} ({p['examples']} examples): branched B_crit (eps={eps:g}) = "
            f"{_answer(a)}  interval [{short_num(lo)}, {short_num(hi)}]"
        )
    return lines


def render_markdown(result: dict, pngs: list[str]) -> str:
    eps = result["epsilons"]
    c = result["cost"]
    lines = [
        "# Critical batch size during training (branched; Merrill et al. 2025, arXiv 2505.23971)",
        "",
        f"Source: `{result['source']}` · reference `{result['reference_trial']}` at B0 = {result['b0']} · "
        f"{len(result['multipliers'])} multipliers {result['multipliers']} · seeds {result['seeds']} · "
        f"Δ = {result['delta_examples']} examples per branch.",
        "",
        f"Rule: the largest k·B0 whose mean held-out loss over the last {100 * result['window']:.0f}% of Δ "
        f"(the evaluation at Δ when 0%) is within ε (relative) of the {result['compare']} "
        "comparator (`reference`: the k = 1 branch, the reference continued), seed means first, interpolated in "
        f"log k; interval: {100 * result['bootstrap']['level']:.0f}% bootstrap over seeds. "
        "≥: the largest multiplier passed (a lower bound); ≤: none passed.",
        "",
        "| step | examples (progress) | loss at point | "
        + " | ".join(f"B_crit ε={e:g}" for e in eps)
        + f" | interval (ε={eps[0]:g}) | B_simple |",
        "|---:|---:|---:|" + "---:|" * len(eps) + ":---:|---:|",
    ]
    for p in result["points"]:
        lo, hi = p["by_epsilon"][0]["b_crit_ci"]
        lines.append(
            f"| {p['branch_step']} | {p['examples']} | {cell_num(p['loss_at_point'])} | "
            + " | ".join(_answer(a) for a in p["by_epsilon"])
            + f" | [{cell_num(lo)}, {cell_num(hi)}] | {cell_num(p.get('b_simple'))} |"
        )
    if result["bins"]:
        lines += ["", f"Per timestep bin (ε = {eps[0]:g}; B_simple of the reference in brackets):", ""]
        lines += ["| bin | timesteps | " + " | ".join(f"step {p['branch_step']}" for p in result["points"]) + " |"]
        lines += ["|---:|:---:|" + "---:|" * len(result["points"])]
        for b in result["bins"]:
            cells = [f"{_answer(p['by_epsilon'][0])} [{cell_num(p.get('b_simple'))}]" for p in b["points"]]
            lines.append(f"| {b['bin']} | {b['timesteps'][0]}–{b['timesteps'][1]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Cost: {c['total_examples']} examples ({c['reference_examples']} reference + "
        f"{c['branch_examples']} branches).",
        "",
    ]
    lines += [f"![{p}]({p})" for p in pngs]
    return "\n".join(lines) + "\n"


def _series(points: list[dict], eps_index: int) -> tuple[np.ndarray, ...]:
    x = np.array([p["examples"] for p in points], dtype=float)
    a = [p["by_epsilon"][eps_index] for p in points]
    y = np.array([np.nan if v["b_crit"] is None else v["b_crit"] for v in a])
    ci = np.array([[np.nan if c is None else c for c in v["b_crit_ci"]] for v in a], dtype=float)
    lower = np.array([v["bound"] == "lower" for v in a])
    return x, y, ci, lower


def plot(result: dict, runs: Runs, path: Path) -> Path:
    """One panel per series (global, then each bin): B_crit vs the reference's examples at the branch point, the
    other tolerances as thin lines, the reference's live B_simple dashed."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    panels = [("global", None, result["points"])] + [
        (f"bin {b['bin']} (t={b['timesteps'][0]}–{b['timesteps'][1]})", b["bin"], b["points"]) for b in result["bins"]
    ]
    fig = Figure(figsize=(4.2 * len(panels), 3.8), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    ref_row = runs.trial_ids.index(result["reference_trial"])
    colors = colormaps["viridis"](np.linspace(0.0, 0.8, len(result["epsilons"])))
    for ax, (title, k, points) in zip(axes, panels, strict=True):
        for i, (eps, c) in enumerate(zip(result["epsilons"], colors, strict=True)):
            x, y, ci, lower = _series(points, i)
            ax.plot(x, y, "o-" if i == 0 else ".-", color=c, lw=1.6 if i == 0 else 0.8, label=f"branched, ε={eps:g}")
            if i == 0:
                ax.fill_between(x, ci[:, 0], ci[:, 1], color=c, alpha=0.2, lw=0)
                ax.plot(x[lower], y[lower], "^", color=c, ms=9, label="lower bound (largest k passed)")
        tr = gns_view.b_simple_trace(runs, ref_row, k)
        if tr is not None:
            ax.plot(tr.step * result["b0"], tr.b_simple, "--", color="C3", lw=1, label="B_simple (reference, live)")
        ax.set(xscale="log", yscale="log", xlabel="reference examples at the branch point")
        ax.set(ylabel="batch size (examples)")
        ax.set_title(f"Critical batch size during training: {title}", fontsize=8)
        ax.legend(fontsize=6)
    fig.savefig(path, dpi=100)
    return path
