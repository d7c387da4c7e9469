"""``bcrit allocate``: the timestep allocation predicted from a sweep's uniform trials, and, when the sweep compared
samplers (``scientific.timestep_sampling``), the measured gain beside it (docs/allocation.md).

``bcrit allocate SWEEP_DIR [--target LOSS] [--floor 0.1] [--bootstrap N] [--seed S] [--out DIR]`` (or
``--mlflow-experiment NAME [--tracking-uri URI] [--parent-run-id ID] --out DIR`` instead of SWEEP_DIR, as in
``bcrit analyze``) prints the tables and writes ``allocation.json``, ``allocation.md`` and ``allocation.png`` to
``--out`` (default ``SWEEP_DIR/analysis``).
Without ``--target``: the one ``bcrit analyze`` quotes, else the lowest trustworthy target of the uniform trials, else
(fewer than 3 batch sizes, as in a paired sweep) the lowest loss every trial reached. User
mistakes print one line ``bcrit allocate: error: ...`` and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from orchestrator.cli import inputs, options
from orchestrator.errors import UserError


def register(subparsers) -> argparse.ArgumentParser:
    p = options.command(
        subparsers,
        "allocate",
        "predicted and measured gain of timestep samplers",
        "The timestep allocation a sweep predicts, and the measured gain of samplers.",
        [
            "bcrit allocate runs/alloc-tiny --target 0.2",
            "bcrit allocate runs/alloc-quadratic --target 0.3 --floor 0.2 --out /tmp/allocation",
        ],
    )
    options.mlflow_source(p)
    options.target(p)
    p.add_argument(
        "--floor",
        type=float,
        default=0.1,
        metavar="SHARE",
        help="uniform share mixed into the noise allocation (default 0.1)",
    )
    options.bootstrap(p)
    options.seed(p)
    options.out(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from analysis.features.allocation.allocation_report import compare
    from analysis.features.allocation.allocation_view import plot, render_markdown
    from analysis.sources.mlflow_uri import TrackingUriError
    from analysis.sources.schema import RunsTableError

    if args.sweep_dir is not None and not os.path.isdir(args.sweep_dir):
        raise UserError(f"{args.sweep_dir} is not a directory; give a sweep directory (storage of a bcrit sweep)")
    if not (0.0 < args.floor <= 1.0) or not (args.target is None or args.target > 0) or args.bootstrap < 0:
        raise UserError("--target must be > 0, --floor in (0, 1] and --bootstrap >= 0")
    options.check_seed(args.seed)
    try:
        runs = inputs.load_runs(args)
    except (RunsTableError, TrackingUriError, OSError) as e:
        raise UserError(f"{args.sweep_dir or args.mlflow_experiment}: {e}") from None
    out = Path(args.out)
    inputs.check_out_dir(str(out))
    target = args.target
    if target is None:
        target, how = _default_target(runs, str(out))
    result = compare(runs, target, args.floor, args.bootstrap, args.seed)
    if result["warning"]:
        print(result["warning"])  # first: the measured B_crit this comparison quotes is flagged
    if args.target is None:
        print(f"target {target:.4g}: {how}")
    out.mkdir(parents=True, exist_ok=True)
    if result["ratios"]:
        plot(result, out / "allocation.png")
    md = render_markdown(result, "allocation.png" if result["ratios"] else None)
    (out / "allocation.md").write_text(md)
    (out / "allocation.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(md)
    return 0


def _default_target(runs, out: str) -> tuple[float, str]:
    """``--target`` when not given: ``bcrit analyze``'s (inputs.default_target) where the uniform trials span enough
    batch sizes for its fit; else (a paired sweep of one or two batch sizes) the lowest loss every trial reached."""
    from analysis.core import metrics as M
    from analysis.features.allocation.allocation_pairs import reached_by_all
    from analysis.fits.pareto import TooFewBatchSizesError
    from analysis.sources.loaders import UNIFORM, samplers_of, subset

    uniform = subset(runs, samplers_of(runs) == UNIFORM)  # bcrit analyze fits B_crit on these
    try:
        return inputs.default_target(uniform, M.EVAL_LOSS, out)
    except TooFewBatchSizesError:
        pass
    target = reached_by_all(runs)
    if target is None:
        raise UserError(
            "no loss is reached by every trial of the sweep below its first evaluations: pass --target LOSS"
        )
    return target, "the lowest eval/loss every trial reached (too few batch sizes for bcrit analyze's targets)"
