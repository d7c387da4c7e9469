"""``bcrit analyze``: runs → ``bcrit.json``, plots and ``report.md`` (and MLflow artifacts of the parent run).

``bcrit analyze SWEEP_DIR|--mlflow-experiment NAME [--metric eval/loss] [--targets a,b,..] [--bootstrap N]
[--seed S] [--no-mlflow] [--out DIR]`` (default ``SWEEP_DIR/analysis``). User mistakes print one line
``bcrit analyze: error: ...`` and exit with status 2, before any compute (output directory, tracking store and
parent run are checked first). Outputs are written to a private directory and moved into ``--out`` file by file
(``os.replace``): a killed run leaves no partial file, and two runs on one sweep both finish with whole, identical
files.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile

from orchestrator.cli import inputs, options
from orchestrator.errors import UserError

DEFAULT_OUT = "analysis"  # SWEEP_DIR/analysis when --out is not given


class UsageError(UserError):
    """A mistake in the command line (a UserError: ``bcrit`` prints it in one line, exit status 2)."""


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
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Execute ``bcrit analyze``; return the exit status (a user's mistake raises a one-line `BcritError`)."""
    return _run(args)


def check_out_dir(out: str) -> None:
    """``--out`` must be a directory we can write (or create) -- checked before any compute, creating nothing."""
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--out {out}: exists and is not a directory; give a directory for the results")
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(f"--out {out}: {probe} is not a directory")
    try:  # os.access says yes to root even on /proc: try it (a directory made and removed at once)
        os.rmdir(tempfile.mkdtemp(prefix=".bcrit-write-test-", dir=probe))
    except OSError as e:
        what = "" if probe == path else f" (cannot create it in {probe})"
        raise UsageError(f"--out {out}: not writable{what} ({e.strerror}); choose another output directory") from None


def check_own_store(sweep_dir: str, tracking_uri: str | None) -> None:
    """A sweep directory copied (or moved) elsewhere keeps its ``mlflow_parent.json``, which names the original
    sweep's SQLite store (and that store's artifact location is absolute): logging the copy's results would write
    them into the original sweep's run. Refused in one line, naming both, before any compute."""
    from analysis.sources.loaders import SWEEP_PARENT_FILE
    from orchestrator.storage.layout import MLFLOW_DB  # not at the top: it loads numpy and pyarrow (bcrit --help)

    prefix = "sqlite:///"
    if not tracking_uri or not tracking_uri.startswith(prefix):
        return
    named = os.path.realpath(tracking_uri[len(prefix) :])
    own = os.path.join(sweep_dir, MLFLOW_DB)
    if os.path.exists(own) and os.path.realpath(own) != named:
        raise UsageError(
            f"{sweep_dir} holds a copy of the sweep in {os.path.dirname(named)}: its {SWEEP_PARENT_FILE} names that "
            f"sweep's MLflow store ({tracking_uri}), so the results would be logged to the original's run; pass "
            "--no-mlflow to analyse the copy without logging, or analyse the original directory"
        )


def check_parent_run(tracking_uri: str | None, parent_run_id: str, source: str) -> str:
    """The MLflow run the results are logged to must exist (a reachable store, checked within seconds). Returns
    the resolved tracking URI. ``source`` says where the run id came from (for the message)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from analysis.sources.mlflow_uri import TrackingUriError, check_tracking_uri

    uri = tracking_uri or mlflow.get_tracking_uri()
    fix = "; pass --no-mlflow to analyse without logging to MLflow"
    try:
        check_tracking_uri(uri, create=False, what=f"the MLflow store of {source}")
    except TrackingUriError as e:
        raise UsageError(f"{e}{fix}") from None
    try:
        mlflow.MlflowClient(uri).get_run(parent_run_id)
    except MlflowException:
        raise UsageError(f"MLflow run {parent_run_id} ({source}) does not exist at {uri}{fix}") from None
    return uri


def check_metric(runs, metric: str, targets: list[float] | None) -> None:
    """Clear messages for data the fit cannot use: every value non-finite, too few batch sizes with a finite
    value, or a target at or above every trial's starting value (every trial meets it before training)."""
    import numpy as np

    from analysis.fits.pareto import MIN_BATCH_SIZES
    from analysis.fits.steps import usable

    s = runs.series(metric)
    if len(s.value) == 0:
        return  # analysis.reporting.report names the metrics that exist
    finite = np.isfinite(s.value)
    if not finite.any():
        raise UsageError(
            f"every {metric} value is NaN or infinite ({len(s.value)} values of {len(runs.trial_ids)} trials): "
            "the trials diverged from the start or the metric was never computed; nothing to analyse"
        )
    ok = usable(runs)
    keep = finite & ok[s.trial]
    have = np.unique(runs.batch_size[np.unique(s.trial[keep])])
    if len(have) < MIN_BATCH_SIZES:
        none = sorted(set(np.unique(runs.batch_size).tolist()) - set(have.tolist()))
        missing = f"; {none} have none" if none else ""
        raise UsageError(
            f"only batch sizes {have.tolist()} have a finite {metric} in a usable (not diverged or failed) trial"
            f"{missing} (need >= {MIN_BATCH_SIZES} batch sizes)"
        )
    if targets:
        t, v = s.trial[keep], s.value[keep]
        first = np.ones(len(t), dtype=bool)
        first[1:] = t[1:] != t[:-1]
        top = float(v[first].max())
        above = [x for x in targets if x >= top]
        if above:
            raise UsageError(
                f"--targets {','.join(f'{x:g}' for x in above)}: at or above every trial's starting {metric} "
                f"(the highest start is {top:.4g}), so every trial meets it before training; choose targets below "
                f"{top:.4g}, or omit --targets for automatic ones"
            )


def _run(args: argparse.Namespace) -> int:
    from analysis.reporting import report
    from analysis.reporting.plots import ANSWER_PNG
    from analysis.reporting.publish import log_analysis
    from analysis.reporting.sweep_kind import BRANCHED, KindError, sweep_kind
    from analysis.sources import loaders

    inputs.localize_sweep_dir(args)  # a storage URI: its local directory, fetched
    if (args.sweep_dir is None) == (args.mlflow_experiment is None) or (args.out is None and not args.sweep_dir):
        inputs.load_runs(args, DEFAULT_OUT)  # says which (one line), before any other check
    targets = None if args.targets is None else parse_targets(args.targets)
    if args.bootstrap < 0:
        raise UsageError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    options.check_seed(args.seed)
    check_out_dir(args.out or os.path.join(args.sweep_dir, DEFAULT_OUT))
    runs = inputs.load_runs(args, DEFAULT_OUT)
    parent = None if args.no_mlflow else (args.parent_run_id or runs.parent_run_id)
    uri = None
    if parent is not None:
        source = "--parent-run-id" if args.parent_run_id else f"{args.sweep_dir}/{loaders.SWEEP_PARENT_FILE}"
        if args.sweep_dir and not (args.parent_run_id or args.tracking_uri):
            check_own_store(args.sweep_dir, runs.tracking_uri)
        uri = check_parent_run(args.tracking_uri or runs.tracking_uri, parent, source)
    try:  # branched, or the S(B) fit on the constant-batch trials (of the uniform sampler when it compared samplers)
        kind = sweep_kind(runs)
    except KindError as e:
        raise UsageError(str(e)) from None
    for note in kind.notes:
        print(f"[bcrit] {note}", file=sys.stderr)
    if kind.kind == BRANCHED:
        return _run_branched(runs, args, parent, uri)
    all_runs, runs = kind.all_runs, kind.runs
    try:
        check_metric(runs, args.metric, targets)
    except UsageError as e:
        if runs is all_runs or "batch sizes" not in str(e):
            raise
        hint = "this sweep compares timestep samplers: `bcrit allocate SWEEP_DIR` measures it"
        raise UsageError(f"{e}; {hint}") from None
    with staging_dir(args.out) as tmp:
        result = report.analyze(
            runs, args.metric, targets, tmp, bootstrap=args.bootstrap, seed=args.seed, plots=not args.no_plots,
            calibrate=not args.no_calibration,
        )  # fmt: skip
        if runs is not all_runs:
            from analysis.features.allocation.allocation_view import add_to_report

            add_to_report(result, all_runs, tmp, bootstrap=min(args.bootstrap, 200))
        keep_recommendation(args.out, tmp, args.metric)
        if parent is not None:
            log_analysis(tmp, uri, parent)
        publish(tmp, args.out, last=report.JSON_FILE)
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


def keep_recommendation(out: str, tmp: str, metric: str) -> None:
    """Carry the ``bcrit recommend`` section of the report in ``out`` into the new one in ``tmp`` (with its
    figure, so that ``report.html`` embeds it): a re-analysis does not drop a recommendation (it stays until the
    next ``bcrit recommend`` replaces it)."""
    from analysis.features.recommend.recommend_report import FIGURE, replace_section, section_in
    from analysis.reporting.html_report import HTML_FILE, render_html
    from analysis.reporting.report import REPORT_FILE

    old, new = os.path.join(out, REPORT_FILE), os.path.join(tmp, REPORT_FILE)
    if not (os.path.isfile(old) and os.path.isfile(new)):
        return
    sec = section_in(open(old, encoding="utf-8").read())
    if sec is None:
        return
    if os.path.isfile(os.path.join(out, FIGURE)):
        shutil.copy2(os.path.join(out, FIGURE), os.path.join(tmp, FIGURE))
    md = replace_section(open(new, encoding="utf-8").read(), sec)
    with open(new, "w", encoding="utf-8") as f:
        f.write(md)
    with open(os.path.join(tmp, HTML_FILE), "w", encoding="utf-8") as f:
        f.write(render_html(md, tmp, title=f"Critical batch size: {metric}"))


@contextlib.contextmanager
def staging_dir(out: str):
    """A private directory next to the outputs (same file system), removed afterwards: the results are written
    there in full, then `publish`-ed, so a killed or concurrent run never leaves a partial ``bcrit.json``."""
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".partial-", dir=out)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: str, out: str, last: str) -> None:
    """Move every file of ``tmp`` into ``out`` with ``os.replace`` (atomic per file), ``last`` after the others
    so that a ``bcrit.json`` newer than the other files never exists."""
    names = sorted(n for n in os.listdir(tmp) if os.path.isfile(os.path.join(tmp, n)))
    for name in [n for n in names if n != last] + [n for n in names if n == last]:
        os.replace(os.path.join(tmp, name), os.path.join(out, name))


def _run_branched(runs, args: argparse.Namespace, parent: str | None, uri: str | None) -> int:
    """A branched study (bcrit branch): analysis.features.branched.branch_report, with the study's own settings; written
    and logged
    like a sweep's analysis (staged, then published)."""
    from analysis.features.branched import branch_report
    from analysis.reporting import report
    from analysis.reporting.publish import log_analysis

    with staging_dir(args.out) as tmp:
        result = branch_report.analyze(runs, tmp, bootstrap=args.bootstrap, seed=args.seed, plots=not args.no_plots)
        if parent is not None:
            log_analysis(tmp, uri, parent)
        publish(tmp, args.out, last=report.JSON_FILE)
    eps = result["epsilons"][0]
    for p in result["points"]:
        a = p["by_epsilon"][0]
        lo, hi = a["b_crit_ci"]
        print(
            f"step {p['branch_step']} ({p['examples']} examples): branched B_crit (eps={eps:g}) = "
            f"{branch_report._answer(a)}  interval [{report.short_num(lo)}, {report.short_num(hi)}]"
        )
    print(f"wrote {args.out}/bcrit.json, report.md" + ("" if args.no_plots else " and branched.png"))
    if parent is not None:
        print(f"logged them as artifacts (analysis/) of MLflow run {parent}")
    return 0
