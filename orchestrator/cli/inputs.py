"""What the sub-commands read, resolved once for all of them: a sweep's runs (a directory, a storage URI fetched, or
an MLflow experiment), the default target loss, the sweep's cost unit; and where they write, checked before any
compute: the output directory, the sweep's own MLflow store and parent run."""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from orchestrator.errors import UserError


def localize_sweep_dir(args: argparse.Namespace) -> None:
    """A ``SWEEP_DIR`` given as the sweep's storage URI stands for its local directory, brought up to date from
    ``<URI>/bcrit/`` first (orchestrator.storage.uri: outputs go there, never back to the URI)."""
    d = getattr(args, "sweep_dir", None)
    if d:
        from orchestrator.storage.uri import fetch, is_uri

        if is_uri(d):
            args.sweep_dir = fetch(d)


def load_runs(args: argparse.Namespace, default_out: str = "analysis"):
    """The runs of ``SWEEP_DIR`` or ``--mlflow-experiment`` (exactly one; from MLflow ``--out`` is required), checked
    before any compute; sets ``args.out`` to ``SWEEP_DIR/<default_out>`` when not given. RunsTableError and
    TrackingUriError say what is wrong in one line."""
    from analysis.sources import loaders
    from analysis.sources.mlflow_uri import check_tracking_uri

    localize_sweep_dir(args)
    if (args.sweep_dir is None) == (args.mlflow_experiment is None):
        raise UserError("give exactly one of SWEEP_DIR or --mlflow-experiment NAME")
    if args.out is None:
        if args.sweep_dir is None:
            raise UserError("--mlflow-experiment needs --out DIR: where to write the results")
        args.out = os.path.join(args.sweep_dir, default_out)
    if args.tracking_uri is not None:
        check_tracking_uri(args.tracking_uri, create=False, what="--tracking-uri")
    if args.mlflow_experiment is None:
        return loaders.load_sweep_dir(args.sweep_dir)
    if args.tracking_uri is None:  # MLflow's default store: it must exist (MLflow would create an empty one)
        import mlflow

        check_tracking_uri(mlflow.get_tracking_uri(), create=False, what="MLflow's default tracking URI")
    return loaders.load_mlflow(args.mlflow_experiment, args.tracking_uri, args.parent_run_id)


def default_target(runs, metric: str, out: str) -> tuple[float, str]:
    """What ``--target`` means when it is not given: ``bcrit.json``'s answer (in ``out``) when it analysed this
    metric, else the lowest trustworthy automatic target; UserError when no target is trustworthy. Returns the
    target and where it came from (for the printout)."""
    from analysis.fits.sweep_fit import analyze_metric
    from analysis.fits.trust import headline
    from analysis.reporting.report import JSON_FILE

    path = os.path.join(out, JSON_FILE)
    if os.path.isfile(path):
        try:
            res = json.loads(open(path, encoding="utf-8").read())
        except (OSError, ValueError):
            res = {}
        at = (res.get("answer") or {}).get("at_target")
        if res.get("metric") == metric and at is not None:
            return float(at), f"the headline target of {path}"
    head = headline(analyze_metric(runs, metric, None, bootstrap=0))
    if not head:
        raise UserError(
            f"no trustworthy target on {metric} (every automatic target is flagged; see bcrit analyze): "
            "pass --target LOSS"
        )
    return min(t["target"] for t in head), "the lowest trustworthy target (no bcrit.json: run bcrit analyze)"


def cost_unit(sweep_dir: str) -> str:
    """``GPU-hours`` / ``CPU-worker-hours`` from the sweep's spec (``scientific.use_gpu``), else ``device-hours``."""
    from orchestrator.storage.layout import SPEC_FILE  # not at the top: it loads numpy and pyarrow (bcrit --help)

    path = os.path.join(sweep_dir, SPEC_FILE)
    try:
        from orchestrator.specs.yaml_overrides import load_yaml

        spec = load_yaml(path)
        use_gpu = (spec.get("scientific") or {}).get("use_gpu")
    except (OSError, ValueError, AttributeError):
        return "device-hours"
    return "device-hours" if use_gpu is None else ("GPU-hours" if use_gpu else "CPU-worker-hours")


def check_out_dir(out: str) -> None:
    """``--out`` must be a directory we can write (or create) -- checked before any compute, creating nothing."""
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--out {out}: exists and is not a directory; give a directory for the results")
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UserError(f"--out {out}: {probe} is not a directory")
    try:  # os.access says yes to root even on /proc: try it (a directory made and removed at once)
        os.rmdir(tempfile.mkdtemp(prefix=".bcrit-write-test-", dir=probe))
    except OSError as e:
        what = "" if probe == path else f" (cannot create it in {probe})"
        raise UserError(f"--out {out}: not writable{what} ({e.strerror}); choose another output directory") from None


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
        raise UserError(
            f"{sweep_dir} holds a copy of the sweep in {os.path.dirname(named)}: its {SWEEP_PARENT_FILE} names that "
            f"sweep's MLflow store ({tracking_uri}), so the results would be logged to the original's run; pass "
            "--no-mlflow to analyse the copy without logging, or analyse the original directory"
        )


def parent_run(args: argparse.Namespace, runs) -> tuple[str | None, str | None]:
    """The MLflow run a command logs its results to and its tracking URI, checked before any compute; ``(None,
    None)`` with ``--no-mlflow`` or when the sweep has none. ``--parent-run-id`` and ``--tracking-uri`` win over what
    the sweep directory names; a sweep directory's own parent run must be in its own store (`check_own_store`)."""
    from analysis.sources.loaders import SWEEP_PARENT_FILE

    parent = None if args.no_mlflow else (args.parent_run_id or runs.parent_run_id)
    if parent is None:
        return None, None
    if args.parent_run_id:
        source = "--parent-run-id"
    elif args.sweep_dir:
        source = f"{args.sweep_dir}/{SWEEP_PARENT_FILE}"
    else:
        source = f"--mlflow-experiment {args.mlflow_experiment}"
    if args.sweep_dir and not (args.parent_run_id or args.tracking_uri):
        check_own_store(args.sweep_dir, runs.tracking_uri)
    return parent, check_parent_run(args.tracking_uri or runs.tracking_uri, parent, source)


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
        raise UserError(f"{e}{fix}") from None
    try:
        mlflow.MlflowClient(uri).get_run(parent_run_id)
    except MlflowException:
        raise UserError(f"MLflow run {parent_run_id} ({source}) does not exist at {uri}{fix}") from None
    return uri
