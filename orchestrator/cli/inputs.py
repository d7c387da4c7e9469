"""What the sub-commands read, resolved once for all of them: a sweep's runs (a directory, a storage URI fetched, or
an MLflow experiment) and the default target loss."""

from __future__ import annotations

import argparse
import json
import os

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
