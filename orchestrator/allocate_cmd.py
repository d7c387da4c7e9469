"""``bcrit allocate``: the timestep allocation predicted from a sweep's uniform trials, and, when the sweep compared
samplers (``scientific.timestep_sampling``), the measured gain beside it (docs/allocation.md).

``bcrit allocate SWEEP_DIR --target LOSS [--floor 0.1] [--bootstrap N] [--out DIR]`` prints the tables and writes
``allocation.json``, ``allocation.md`` and ``allocation.png`` to ``--out`` (default ``SWEEP_DIR/analysis``). User
mistakes print one line ``bcrit allocate: error: ...`` and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from orchestrator.overrides import UserError


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("allocate", help="predicted and measured gain of timestep samplers", description=__doc__)
    p.add_argument("sweep_dir", help="directory holding trials.parquet and metrics.parquet")
    p.add_argument("--target", type=float, required=True, help="eval/loss target of the steps-to-target")
    p.add_argument("--floor", type=float, default=0.1, help="uniform share mixed into the noise allocation")
    p.add_argument("--bootstrap", type=int, default=200, help="bootstrap replicates for the B_crit intervals")
    p.add_argument("--out", help="output directory (default: SWEEP_DIR/analysis)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from analysis.allocation_report import compare
    from analysis.allocation_view import plot, render_markdown
    from analysis.loaders import load_sweep_dir
    from analysis.schema import RunsTableError

    if not os.path.isdir(args.sweep_dir):
        raise UserError(f"{args.sweep_dir} is not a directory; give a sweep directory (storage of a bcrit sweep)")
    if not (0.0 < args.floor <= 1.0) or not args.target > 0 or args.bootstrap < 0:
        raise UserError("--target must be > 0, --floor in (0, 1] and --bootstrap >= 0")
    try:
        runs = load_sweep_dir(args.sweep_dir)
    except (RunsTableError, OSError) as e:
        raise UserError(f"{args.sweep_dir}: {e}") from None
    result = compare(runs, args.target, args.floor, args.bootstrap)
    out = Path(args.out or os.path.join(args.sweep_dir, "analysis"))
    out.mkdir(parents=True, exist_ok=True)
    if result["ratios"]:
        plot(result, out / "allocation.png")
    md = render_markdown(result, "allocation.png" if result["ratios"] else None)
    (out / "allocation.md").write_text(md)
    (out / "allocation.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(md)
    return 0
