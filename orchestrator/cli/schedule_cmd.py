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
from orchestrator.features.schedule.schedule_plan import SCHEDULE_FILE, analysis_file, download_analysis, plan, render


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


def schedule_command(args) -> int:
    runs = sweep = None
    if args.mlflow_experiment is not None or args.sweep_dir is None:
        runs = inputs.load_runs(args)  # one line for a missing SWEEP_DIR / --mlflow-experiment / --out
        path = download_analysis(runs, args.out, args.mlflow_experiment)
    else:
        path, sweep = analysis_file(args.sweep_dir)
    out_dir = args.out or os.path.dirname(os.path.abspath(path))
    inputs.check_out_dir(out_dir)
    out, metric = plan(path, args.batch_sizes, args.reference, sweep, runs)
    os.makedirs(out_dir, exist_ok=True)
    written = os.path.join(out_dir, SCHEDULE_FILE)
    with open(written, "w") as f:
        json.dump(out, f, indent=1)
    if out["warning"]:
        print(out["warning"])
    print(render(out, metric, path))
    print(f"wrote {written}")
    return 0
