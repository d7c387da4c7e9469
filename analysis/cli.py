"""``bcrit analyze``: runs → ``bcrit.json``, plots and ``report.md`` (and MLflow artifacts of the parent run).

``bcrit analyze SWEEP_DIR|--mlflow-experiment NAME [--metric eval/loss] [--targets a,b,..] [--bootstrap N]
[--seed S] --out DIR``. User mistakes print one line ``bcrit analyze: error: ...`` and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys

from analysis import metrics as m

PROG = "bcrit analyze"


class UsageError(ValueError):
    """A mistake in the command line."""


def parse_targets(text: str) -> list[float]:
    """``"0.3,0.25"`` → ``[0.3, 0.25]``; UsageError for anything but finite numbers."""
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"--targets must be comma-separated numbers, got {text!r}") from None
    if not all(v == v and abs(v) != float("inf") for v in vals):
        raise UsageError(f"--targets must be finite numbers, got {text!r}")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep_dir", nargs="?", help="directory holding trials.parquet and metrics.parquet")
    p.add_argument("--mlflow-experiment", help="read the sweep from this MLflow experiment instead")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's own default)")
    p.add_argument("--parent-run-id", help="the sweep's parent run (default: newest run with child runs)")
    p.add_argument("--metric", default=m.EVAL_LOSS, help="low-noise metric the targets refer to")
    p.add_argument("--targets", help="comma-separated target values (default: automatic)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap replicates for the interval")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    p.add_argument("--no-plots", action="store_true", help="write bcrit.json and report.md only")
    p.add_argument("--out", required=True, help="output directory")


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``analyze`` sub-command to a ``bcrit`` parser's subparsers; returns the sub-parser."""
    p = subparsers.add_parser("analyze", help="critical batch size from a sweep", description=__doc__)
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Execute ``bcrit analyze``; return the exit status (0 ok, 2 user error)."""
    from analysis.pareto import TooFewBatchSizesError
    from analysis.schema import RunsTableError

    try:
        return _run(args)
    except (UsageError, RunsTableError, TooFewBatchSizesError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from analysis import loaders, report

    if (args.sweep_dir is None) == (args.mlflow_experiment is None):
        raise UsageError("give exactly one of SWEEP_DIR or --mlflow-experiment NAME")
    targets = None if args.targets is None else parse_targets(args.targets)
    if args.bootstrap < 0:
        raise UsageError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    if args.mlflow_experiment is not None:
        runs = loaders.load_mlflow(args.mlflow_experiment, args.tracking_uri, args.parent_run_id)
    else:
        runs = loaders.load_sweep_dir(args.sweep_dir)
    result = report.analyze(
        runs, args.metric, targets, args.out, bootstrap=args.bootstrap, seed=args.seed, plots=not args.no_plots
    )
    parent = args.parent_run_id or runs.parent_run_id
    if parent is not None:
        report.log_to_mlflow(args.out, args.tracking_uri or runs.tracking_uri, parent)
    for t in result["targets"]:
        lo, hi = t["b_crit_ci"]
        print(
            f"target {t['target']:.4g}: B_crit = {_fmt(t['b_crit'])}  90% CI [{_fmt(lo)}, {_fmt(hi)}]  "
            f"({len(t['points'])} batch sizes)"
        )
    print(f"wrote {args.out}/bcrit.json, report.md, report.html" + ("" if args.no_plots else " and plots"))
    if parent is not None:
        print(
            f"logged to MLflow run {parent}: B_crit per target as metrics (b_crit/<target>, ...), the table "
            "analysis/headline.json, the report analysis/report.html"
        )
    return 0


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2, like argparse but without the usage block
        print(f"{PROG}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.cli ...``: the same as ``bcrit analyze ...``."""
    p = _Parser(prog=PROG, description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
