"""A batch-size schedule from a sweep's analysis (analysis.features.schedule.schedule), shared by ``bcrit schedule`` and
the schedule line of ``bcrit recommend``: the analysis file, the batch sizes, the tuned lrs, the measured throughput,
the proposal's summary and its printout."""

from __future__ import annotations

import json
import math
import os

from analysis.core import metrics as M
from orchestrator.errors import UserError

SCHEDULE_FILE = "schedule.json"
SEGMENT_KEYS = ("hi", "lo", "s_min", "e_min", "b_local", "source")  # a segment's fields in schedule.json, in order


def analysis_file(path: str) -> tuple[str, str | None]:
    """``(bcrit.json, sweep dir or None)`` of the positional argument."""
    if os.path.isfile(path):
        return path, None
    candidate = os.path.join(path, "analysis", "bcrit.json")
    if os.path.isfile(candidate):
        return candidate, path
    raise UserError(f"{path} holds no analysis ({candidate} missing); run `bcrit analyze {path}` first")


def batch_sizes_of(text: str | None, result: dict) -> list[int]:
    if text is None:
        found = {int(p["batch_size"]) for t in result["targets"] for p in t.get("points", [])}
        if not found:
            raise UserError("the analysis lists no batch sizes; give --batch-sizes 16,32,...")
        return sorted(found)
    try:
        sizes = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise UserError(f"--batch-sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise UserError(f"--batch-sizes must be positive integers, got {text!r}")
    return sizes


def throughput_per_batch(sweep: str | None, runs=None) -> dict[int, float]:
    """Median ``sys/examples_per_s`` per batch size of the sweep's trials (``runs`` when given, else read from the
    sweep directory; {} without tables or measurements)."""
    # numpy: deferred, bcrit --help loads this module
    import numpy as np

    # numpy and pyarrow: deferred, bcrit --help loads this module
    from analysis.sources.loaders import load_sweep_dir

    if runs is None:
        if sweep is None or not os.path.isfile(os.path.join(sweep, "metrics.parquet")):
            return {}
        runs = load_sweep_dir(sweep)
    s = runs.series(M.SYS_EXAMPLES_PER_S)
    b = runs.batch_size[s.trial]
    return {int(x): float(np.median(s.value[b == x])) for x in np.unique(b)}


def is_fitted(t: dict) -> bool:
    return all(isinstance(t.get(k), (int, float)) and math.isfinite(t[k]) for k in ("s_min", "e_min"))


def tuned_lrs(result: dict, segments) -> list[dict[int, float]]:
    """Per segment, batch size -> the best trial's lr at the segment's end target; a batch size that did not reach
    that target keeps its lr of the last target it reached."""
    known: dict[int, float] = {}
    at: dict[float, dict[int, float]] = {}
    for t in sorted(result["targets"], key=lambda t: -t["target"]):
        known = {**known, **{int(p["batch_size"]): p["lr"] for p in t.get("points", []) if p.get("lr") is not None}}
        at[t["target"]] = known
    return [at.get(s.lo, {}) for s in segments]


def summary(proposal, seg_lrs: list[dict], throughput: dict[int, float], notes: list[str]) -> dict:
    """The proposal as plain data (what schedule.json holds)."""
    stages, stage_lrs = proposal.schedule.stages(seg_lrs)
    entries = [
        [s, b] if lr is None else [s, b, lr] for s, b, lr in zip(stages.starts, stages.sizes, stage_lrs, strict=True)
    ]

    def row(name: str, p) -> dict:
        return {"plan": name, "sizes": list(p.sizes), "steps": p.total_steps, "examples": p.total_examples,
                "seconds": p.seconds(throughput)}  # fmt: skip

    return {
        "segments": [
            {**{k: getattr(s, k) for k in SEGMENT_KEYS}, "batch_size": b, "steps": st}
            for s, b, st in zip(proposal.segments, proposal.schedule.sizes, proposal.schedule.steps, strict=True)
        ],
        "trial": {"batch_size": stages.sizes[0], "lr": stage_lrs[0], "batch_schedule": entries[1:]},
        "schedule": row("schedule", proposal.schedule),
        "reference": row(f"constant {proposal.reference.sizes[0]}", proposal.reference),
        "constants": [row(f"constant {p.sizes[0]}", p) for p in proposal.constants],
        "notes": notes,
    }


def fmt_num(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, ".4g")


def proposed(result: dict, batch_sizes: str | None, reference: int | None, sweep: str | None, runs=None) -> dict | None:
    """`summary` of the schedule proposed from the analysis ``result`` (``batch_sizes``: as `batch_sizes_of`; the
    throughput: as `throughput_per_batch`); None where no target has a usable fit."""
    from analysis.features.schedule.schedule import propose, segments_of

    segments, notes = segments_of(result)
    if not segments:
        return None
    proposal = propose(segments, batch_sizes_of(batch_sizes, result), reference)
    return summary(proposal, tuned_lrs(result, segments), throughput_per_batch(sweep, runs), notes)


def download_analysis(runs, out_dir: str, experiment: str) -> str:
    """The ``bcrit.json`` that ``bcrit analyze --mlflow-experiment`` logged to the sweep's parent run (artifact
    ``analysis/bcrit.json``), downloaded into ``out_dir``; returns its path."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from analysis.reporting.publish import ARTIFACT_DIR

    os.makedirs(out_dir, exist_ok=True)
    try:
        return MlflowClient(runs.tracking_uri).download_artifacts(
            runs.parent_run_id, f"{ARTIFACT_DIR}/bcrit.json", out_dir
        )
    except (MlflowException, OSError):
        raise UserError(
            f"MLflow run {runs.parent_run_id} holds no {ARTIFACT_DIR}/bcrit.json; run `bcrit analyze "
            f"--mlflow-experiment {experiment} --out DIR` first"
        ) from None


def plan(path: str, batch_sizes: str | None, reference: int | None, sweep: str | None, runs=None) -> tuple[dict, str]:
    """``(what bcrit schedule writes to schedule.json, the metric)``: the proposal from the analysis at ``path`` with
    the trust flags of the targets it is built from (UserError for an analysis or flags it cannot use)."""
    from analysis.reporting.trust_note import untrusted_line

    try:
        with open(path) as f:
            result = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(result, dict) or not isinstance(result.get("targets"), list):
        raise UserError(f"{path} is not a bcrit analysis (no targets); run bcrit analyze again")
    sizes = batch_sizes_of(batch_sizes, result)
    if reference is not None and reference not in sizes:
        raise UserError(f"--reference {reference} is not among the batch sizes {sizes}; pick one of them")
    out = proposed(result, batch_sizes, reference, sweep, runs)
    if out is None:
        raise UserError(f"{path}: no target has a usable fit (S_min, E_min > 0); analyse more targets")
    used = [t for t in result["targets"] if is_fitted(t)]  # the targets segments_of builds the segments from
    out["flags"] = {f"{t['target']:g}": list(t.get("flags") or []) for t in used}
    out["warning"] = untrusted_line({float(t): f for t, f in out["flags"].items()}, "this schedule")
    return out, result.get("metric", "?")


def render(out: dict, metric: str, path: str) -> str:
    """``bcrit schedule``'s printout: the segments, the proposed trial settings, the plans compared."""
    lines = [f"bcrit schedule: {path} ({metric}, {len(out['segments'])} segments)", ""]
    lines.append(f"{'segment':>18} {'ΔS_min':>9} {'ΔE_min':>10} {'B_local':>9} {'B':>6} {'steps':>9}")
    for s in out["segments"]:
        seg = f"{'init' if s['hi'] is None else format(s['hi'], '.4g')} -> {s['lo']:.4g}"
        lines.append(f"{seg:>18} {s['s_min']:9.4g} {s['e_min']:10.4g} {s['b_local']:9.4g} {s['batch_size']:6d} "
                     f"{s['steps']:9.4g}")  # fmt: skip
    t = out["trial"]
    lines += [
        "",
        f"proposal: batch_size {t['batch_size']}, lr {fmt_num(t['lr'])}, batch_schedule {t['batch_schedule']}",
    ]
    lines += ["", f"{'plan':>20} {'steps':>9} {'examples':>11} {'seconds':>9}"]
    ref = out["reference"]
    for r in [out["schedule"], {**ref, "plan": ref["plan"] + " (ref)"}, *out["constants"]]:
        lines.append(f"{r['plan']:>20} {r['steps']:9.4g} {r['examples']:11.5g} {fmt_num(r['seconds']):>9}")
    sched = out["schedule"]
    lines.append(
        f"\npredicted vs {ref['plan']}: {100 * (1 - sched['steps'] / ref['steps']):.1f}% fewer steps, "
        f"{100 * (1 - sched['examples'] / ref['examples']):.1f}% fewer examples"
        + (
            f", {100 * (1 - sched['seconds'] / ref['seconds']):.1f}% less time"
            if sched["seconds"] and ref["seconds"]
            else ""
        )
    )
    lines += [f"note: {n}" for n in out["notes"]]
    return "\n".join(lines)


def schedule_line(sweep_dir: str) -> str:
    """One line on growing the batch during training: the step-minimising ``batch_schedule`` within the examples of
    the constant batch size nearest B_crit (``bcrit schedule``, analysis.features.schedule.schedule), from the sweep's
    analysis."""
    try:
        path, _ = analysis_file(sweep_dir)
        with open(path) as f:
            result = json.load(f)
        out = proposed(result, None, None, sweep_dir)
    except (UserError, OSError, ValueError, KeyError) as e:
        return f"batch schedule: not proposed ({e})"
    if out is None:
        return "batch schedule: no target has a usable fit to propose one from"
    sched, ref = out["schedule"], out["reference"]
    if len(set(sched["sizes"])) == 1:
        return (f"batch schedule: none proposed -- no growing batch beats {ref['plan']} within its examples "
                f"(bcrit schedule {sweep_dir} shows the segments)")  # fmt: skip
    t = out["trial"]
    return (
        f"batch schedule: start at batch_size {t['batch_size']}, batch_schedule {t['batch_schedule']}: predicted "
        f"{100 * (1 - sched['steps'] / ref['steps']):.0f}% fewer steps and "
        f"{100 * (1 - sched['examples'] / ref['examples']):.0f}% fewer examples than {ref['plan']} "
        f"(bcrit schedule {sweep_dir}; docs/schedule.md)"
    )
