"""``bcrit recommend``: the fastest and the cheapest split ``micro x A x W`` to reach a target loss.

``bcrit recommend SWEEP_DIR [--target LOSS] [--metric eval/loss] [--device-mem-gb D] [--gpus-per-worker G]
[--max-workers W] [--max-accum A] [--max-batch B] [--bootstrap N] [--seed S] [--no-mlflow] [--out DIR]`` (default
``SWEEP_DIR/analysis``); ``--mlflow-experiment NAME [--tracking-uri URI] [--parent-run-id ID] --out DIR`` instead of
SWEEP_DIR reads the sweep from MLflow, as ``bcrit analyze`` does. Without ``--target``: the target ``bcrit analyze``
quotes (``bcrit.json``'s answer), else the lowest trustworthy automatic target. Writes ``recommend.json``,
``recommend.png`` and ``recommend.md``, puts the same section into ``report.md``/``report.html`` when they exist,
and logs them to the sweep's MLflow parent run.
The science is in :mod:`analysis.features.recommend.recommend` (docs/recommend.md), the run in
:mod:`analysis.features.recommend.recommend_report`. User mistakes: one line, exit status 2.
"""

from __future__ import annotations

import argparse
import math
import os

from analysis.core.device_share import share_error
from orchestrator.cli import inputs, options
from orchestrator.errors import UserError
from orchestrator.features.schedule.schedule_plan import schedule_line


def register(subparsers) -> argparse.ArgumentParser:
    p = options.command(
        subparsers,
        "recommend",
        "the fastest and cheapest way to a target loss",
        "The fastest and the cheapest split (micro x A x W) to reach a target loss.",
        [
            "bcrit recommend runs/tiny                        # at the target bcrit analyze quotes",
            "bcrit recommend runs/tiny-splits --target 0.2",
            "bcrit recommend runs/tiny --device-mem-gb 80 --gpus-per-worker 0.25 --max-workers 8",
        ],
    )
    options.mlflow_source(p)
    options.target(p)
    options.metric(p)
    p.add_argument(
        "--device-mem-gb",
        type=float,
        metavar="GIB",
        help="memory of one device (GiB): splits predicted above it are excluded",
    )
    p.add_argument(
        "--gpus-per-worker",
        type=float,
        default=1.0,
        metavar="SHARE",
        help="share of one device a worker holds (scientific.gpus_per_worker, (0, 1]): with --device-mem-gb, splits "
        "predicted above that share of it are excluded, and packed trials run one worker (default: 1)",
    )
    p.add_argument(
        "--max-workers", type=int, metavar="W", help="largest number of workers to consider (default: largest measured)"
    )
    p.add_argument(
        "--max-accum", type=int, metavar="A", help="largest accumulation to consider (default: largest measured)"
    )
    p.add_argument(
        "--max-batch", type=int, metavar="B", help="largest batch size (default: largest fitted; above is extrapolated)"
    )
    options.bootstrap(p)
    options.seed(p)
    options.no_mlflow(p)
    options.out(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from analysis.features.recommend import recommend_report as rr
    from analysis.reporting.publish import log_recommendation

    check_args(args)
    runs = inputs.load_runs(args)
    out = args.out
    inputs.check_out_dir(out)
    parent, uri = inputs.parent_run(args, runs)
    rr.check(runs, args.metric, args.target)
    target, how = (
        (args.target, "--target") if args.target is not None else inputs.default_target(runs, args.metric, out)
    )
    rec, lines = rr.run(
        runs, target, how, args.metric, out, unit=inputs.cost_unit(args.sweep_dir or out),
        device_mem_gb=args.device_mem_gb, gpus_per_worker=args.gpus_per_worker, max_workers=args.max_workers,
        max_accum=args.max_accum, max_batch=args.max_batch, n_boot=args.bootstrap, seed=args.seed,
    )  # fmt: skip
    if parent:
        log_recommendation(out, uri, parent, rec)
    print("\n".join(lines))
    print(schedule_line(args.sweep_dir or os.path.join(out, "bcrit.json")))
    print(
        f"wrote {out}/{rr.JSON_FILE}, {rr.FIGURE}, recommend.md"
        + (f"; logged to MLflow run {parent}" if parent else "")
    )
    return 0


def check_args(args: argparse.Namespace) -> None:
    """Every flag's value, before any compute."""
    if args.target is not None and not math.isfinite(args.target):
        raise UserError(f"--target must be a finite loss, got {args.target}")
    if args.device_mem_gb is not None and not (math.isfinite(args.device_mem_gb) and args.device_mem_gb > 0):
        raise UserError(f"--device-mem-gb must be a positive number of GiB, got {args.device_mem_gb}")
    if why := share_error("--gpus-per-worker", args.gpus_per_worker):
        raise UserError(why)
    for flag in ("max_workers", "max_accum", "max_batch"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be an integer >= 1, got {v}")
    if args.bootstrap < 1:
        raise UserError(f"--bootstrap must be >= 1 (the intervals need replicates), got {args.bootstrap}")
    options.check_seed(args.seed)
