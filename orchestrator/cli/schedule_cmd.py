"""``bcrit schedule SWEEP_DIR [--reference B] [--batch-sizes 8,16,..] [--out DIR]``: propose a batch-size schedule
from a sweep's analysis (analysis.features.schedule.schedule); writes it to ``schedule.json`` in ``--out`` (default
SWEEP_DIR/analysis).

Reads the analysis ``bcrit analyze`` wrote (``SWEEP_DIR/analysis/bcrit.json``, or a ``bcrit.json`` given directly):
per target the fit ``S = S_min + E_min/B`` and the tuned lr per batch size, per band the local fit. Prints the
segments with their local critical batch size, the proposed trial settings (``batch_size``, ``lr``,
``batch_schedule``) and the predicted steps, examples and -- where the sweep measured ``sys/examples_per_s`` --
seconds, against the reference constant batch size and every constant one. Bad input: one line, exit 2.
"""

from __future__ import annotations

import json
import os

from orchestrator.cli import inputs, options
from orchestrator.errors import UserError
from orchestrator.features.schedule.schedule_plan import (
    analysis_file,
    batch_sizes_of,
    fmt_num,
    is_fitted,
    summary,
    throughput_per_batch,
    tuned_lrs,
)

SCHEDULE_FILE = "schedule.json"


def register(sub) -> None:
    """Add the ``schedule`` sub-command to ``bcrit``'s sub-parsers."""
    p = options.command(
        sub,
        "schedule",
        "a batch-size schedule that follows B_crit",
        "Propose a batch-size schedule that follows the measured B_crit along training.",
        [
            f"bcrit schedule runs/schedule-quadratic            # after bcrit analyze; writes analysis/{SCHEDULE_FILE}",
            "bcrit schedule runs/tiny --reference 32 --batch-sizes 8,16,32,64,128",
            "bcrit schedule runs/tiny/analysis/bcrit.json --out /tmp/schedule",
        ],
    )
    options.mlflow_source(p)
    p.add_argument(
        "--reference", type=int, metavar="B", help="the constant batch size to beat (default: nearest B_crit)"
    )
    p.add_argument("--batch-sizes", metavar="LIST", help="allowed batch sizes, comma-separated (default: the sweep's)")
    options.out(p)
    p.set_defaults(func=schedule_command)


def from_mlflow(args) -> tuple[object, str]:
    """``(runs, bcrit.json)`` of ``--mlflow-experiment``: the analysis ``bcrit analyze --mlflow-experiment`` logged to
    the sweep's parent run (artifact ``analysis/bcrit.json``), downloaded into ``--out``."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from analysis.reporting.publish import ARTIFACT_DIR
    from analysis.sources.mlflow_uri import TrackingUriError
    from analysis.sources.schema import RunsTableError

    try:
        runs = inputs.load_runs(args)  # one line for a missing SWEEP_DIR / --mlflow-experiment / --out
    except (RunsTableError, TrackingUriError) as e:
        raise UserError(str(e)) from None
    os.makedirs(args.out, exist_ok=True)
    try:
        got = MlflowClient(runs.tracking_uri).download_artifacts(
            runs.parent_run_id, f"{ARTIFACT_DIR}/bcrit.json", args.out
        )
    except (MlflowException, OSError):
        raise UserError(
            f"MLflow run {runs.parent_run_id} holds no {ARTIFACT_DIR}/bcrit.json; run `bcrit analyze "
            f"--mlflow-experiment {args.mlflow_experiment} --out DIR` first"
        ) from None
    return runs, got


def schedule_command(args) -> int:
    from analysis.features.schedule.schedule import propose, segments_of
    from analysis.reporting.trust_note import untrusted_line
    from orchestrator.cli.analyze_cmd import check_out_dir

    runs = None
    if args.mlflow_experiment is not None or args.sweep_dir is None:
        runs, path = from_mlflow(args)
        sweep = None
    else:
        path, sweep = analysis_file(args.sweep_dir)
    out_dir = args.out or os.path.dirname(os.path.abspath(path))
    check_out_dir(out_dir)
    try:
        with open(path) as f:
            result = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(result, dict) or not isinstance(result.get("targets"), list):
        raise UserError(f"{path} is not a bcrit analysis (no targets); run bcrit analyze again")
    sizes = batch_sizes_of(args.batch_sizes, result)
    if args.reference is not None and args.reference not in sizes:
        raise UserError(f"--reference {args.reference} is not among the batch sizes {sizes}; pick one of them")
    segments, notes = segments_of(result)
    if not segments:
        raise UserError(f"{path}: no target has a usable fit (S_min, E_min > 0); analyse more targets")
    proposal = propose(segments, sizes, args.reference)
    out = summary(proposal, tuned_lrs(result, segments), throughput_per_batch(sweep, runs), notes)
    used = [t for t in result["targets"] if is_fitted(t)]  # the targets segments_of builds the segments from
    out["flags"] = {f"{t['target']:g}": list(t.get("flags") or []) for t in used}
    out["warning"] = untrusted_line({float(t): f for t, f in out["flags"].items()}, "this schedule")
    os.makedirs(out_dir, exist_ok=True)
    written = os.path.join(out_dir, SCHEDULE_FILE)
    with open(written, "w") as f:
        json.dump(out, f, indent=1)
    if out["warning"]:
        print(out["warning"])
    print(render(out, result.get("metric", "?"), path))
    print(f"wrote {written}")
    return 0


def render(out: dict, metric: str, path: str) -> str:
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
