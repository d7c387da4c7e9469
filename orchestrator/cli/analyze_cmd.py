"""``bcrit analyze``: runs → ``bcrit.json``, plots and ``report.md`` (and MLflow artifacts of the parent run).

``bcrit analyze SWEEP_DIR|--mlflow-experiment NAME [--metric eval/loss] [--targets a,b,..] [--bootstrap N]
[--seed S] [--no-mlflow] [--out DIR]`` (default ``SWEEP_DIR/analysis``). User mistakes print one line
``bcrit analyze: error: ...`` and exit with status 2, before any compute (output directory, tracking store and
parent run are checked first). Outputs are staged, then moved into ``--out`` file by file (analysis.reporting.report).
"""

from __future__ import annotations

import argparse
import os
import sys

from orchestrator.cli import inputs, options
from orchestrator.errors import UserError

DEFAULT_OUT = "analysis"  # SWEEP_DIR/analysis when --out is not given


def parse_targets(text: str) -> list[float]:
    """``"0.3,0.25"`` → ``[0.3, 0.25]``; UserError for anything but finite numbers."""
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"--targets must be comma-separated numbers, got {text!r}") from None
    if not all(v == v and abs(v) != float("inf") for v in vals):
        raise UserError(f"--targets must be finite numbers, got {text!r}")
    return vals


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``analyze`` sub-command to a ``bcrit`` parser's subparsers; returns the sub-parser."""
    p = options.command(
        subparsers,
        "analyze",
        "the critical batch size of a sweep",
        "The critical batch size of a sweep: bcrit.json, report.md/html and figures.",
        [
            "bcrit analyze runs/tiny                          # writes runs/tiny/analysis",
            "bcrit analyze runs/tiny --targets 0.2,0.18 --bootstrap 2000 --out /tmp/tiny-analysis",
            "bcrit analyze --mlflow-experiment bcrit-tiny --tracking-uri sqlite:///$PWD/runs/tiny/mlflow.db --out out",
        ],
    )
    options.mlflow_source(p)
    options.metric(p)
    p.add_argument("--targets", metavar="LOSSES", help="comma-separated target losses (default: automatic)")
    options.bootstrap(p)
    p.add_argument("--no-calibration", action="store_true",
                   help="take the intervals at the nominal 90%% level, not the level calibrated by a parametric "
                   "double bootstrap (docs/intervals.md)")  # fmt: skip
    options.seed(p)
    p.add_argument("--no-plots", action="store_true", help="write bcrit.json and report.md only")
    options.no_mlflow(p)
    options.out(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Execute ``bcrit analyze``; return the exit status (a user's mistake raises a one-line `BcritError`)."""
    from analysis.reporting import report
    from analysis.reporting.plots import ANSWER_PNG
    from analysis.reporting.publish import log_analysis
    from analysis.reporting.sweep_kind import BRANCHED, check_sweep, sweep_kind

    inputs.localize_sweep_dir(args)  # a storage URI: its local directory, fetched
    if (args.sweep_dir is None) == (args.mlflow_experiment is None) or (args.out is None and not args.sweep_dir):
        inputs.load_runs(args, DEFAULT_OUT)  # says which (one line), before any other check
    targets = None if args.targets is None else parse_targets(args.targets)
    if args.bootstrap < 0:
        raise UserError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    options.check_seed(args.seed)
    inputs.check_out_dir(args.out or os.path.join(args.sweep_dir, DEFAULT_OUT))
    runs = inputs.load_runs(args, DEFAULT_OUT)
    parent, uri = inputs.parent_run(args, runs)
    kind = sweep_kind(runs)  # branched, or the S(B) fit on the constant-batch trials (of the uniform sampler)
    for note in kind.notes:
        print(f"[bcrit] {note}", file=sys.stderr)
    check_sweep(kind, args.metric, targets)
    with report.staging_dir(args.out) as tmp:
        result = analyze_into(tmp, kind, targets, args)
        if parent is not None:
            log_analysis(tmp, uri, parent)
        report.publish(tmp, args.out, last=report.JSON_FILE)
    if kind.kind == BRANCHED:
        from analysis.features.branched.branch_report import summary_lines

        for line in summary_lines(result):
            print(line)
        print(f"wrote {args.out}/bcrit.json, report.md" + ("" if args.no_plots else " and branched.png"))
        if parent is not None:
            print(f"logged them as artifacts (analysis/) of MLflow run {parent}")
        return 0
    print("\n".join(report.summary_lines(result)))
    print(f"wrote {args.out}/bcrit.json, report.md, report.html" + ("" if args.no_plots else " and plots"))
    if parent is not None:
        print(
            f"logged to MLflow run {parent}: B_crit per target as metrics (b_crit/<target>, ...), the table "
            "analysis/headline.json, the report analysis/report.html"
        )
    print("\n".join(report.answer_lines(result)))  # the answer last, where a user looks first
    print(f"report: {os.path.abspath(os.path.join(args.out, 'report.html'))}")
    figure = os.path.join(args.out, ANSWER_PNG)
    if os.path.exists(figure):
        print(f"figure: {os.path.abspath(figure)}")
    return 0


def analyze_into(tmp: str, kind, targets: list[float] | None, args: argparse.Namespace) -> dict:
    """The analysis of the sweep's kind, written into ``tmp``: a branched study's (its own settings), else the S(B)
    fit's, with the sampler comparison and the last ``bcrit recommend`` section kept."""
    from analysis.features.allocation.allocation_view import add_to_report
    from analysis.features.branched import branch_report
    from analysis.features.recommend.recommend_report import carry_section
    from analysis.reporting import report
    from analysis.reporting.sweep_kind import BRANCHED

    if kind.kind == BRANCHED:
        return branch_report.analyze(kind.runs, tmp, bootstrap=args.bootstrap, seed=args.seed, plots=not args.no_plots)
    result = report.analyze(
        kind.runs, args.metric, targets, tmp, bootstrap=args.bootstrap, seed=args.seed, plots=not args.no_plots,
        calibrate=not args.no_calibration,
    )  # fmt: skip
    if kind.compares_samplers:
        add_to_report(result, kind.all_runs, tmp, bootstrap=min(args.bootstrap, 200))
    carry_section(args.out, tmp, args.metric)
    return result
