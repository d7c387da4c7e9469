"""The options that several ``bcrit`` sub-commands share, each defined once: one name has one meaning, type,
default and help line in every sub-command (tests/orchestrator/test_cli_options.py walks every parser to check).

A sub-command adds the ones it takes (``options.out(p)``); options only one sub-command has stay in its module.
"""

from __future__ import annotations

import argparse
import json
import os

from analysis.core import metrics as m
from orchestrator.overrides import UserError

DEFAULT_BOOTSTRAP = 1000


def sweep_dir(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """The positional ``SWEEP_DIR`` of the commands that read a finished sweep."""
    p.add_argument(
        "sweep_dir",
        metavar="SWEEP_DIR",
        nargs="?" if optional else None,
        help="a sweep directory: the spec's storage, holding trials.parquet and metrics.parquet (or the storage "
        "URI, s3://...: read into its local directory first)",
    )


def localize_sweep_dir(args: argparse.Namespace) -> None:
    """A ``SWEEP_DIR`` given as the sweep's storage URI stands for its local directory, brought up to date from
    ``<URI>/bcrit/`` first (orchestrator.uri_storage: outputs go there, never back to the URI)."""
    d = getattr(args, "sweep_dir", None)
    if d:
        from orchestrator.uri_storage import fetch, is_uri

        if is_uri(d):
            args.sweep_dir = fetch(d)


def mlflow_source(p: argparse.ArgumentParser) -> None:
    """The optional ``SWEEP_DIR`` or ``--mlflow-experiment NAME`` (with ``--tracking-uri``, ``--parent-run-id``) of the
    commands that read a finished sweep's runs: ``bcrit analyze``, ``recommend``, ``allocate``."""
    sweep_dir(p, optional=True)
    p.add_argument("--mlflow-experiment", help="read the sweep from this MLflow experiment instead")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's own default)")
    p.add_argument("--parent-run-id", help="the sweep's parent run (default: newest run with child runs)")


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


def target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        type=float,
        metavar="LOSS",
        help="the target loss (default: the one bcrit analyze quotes in SWEEP_DIR/analysis/bcrit.json, else the "
        "lowest trustworthy automatic target)",
    )


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


def metric(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metric", default=m.EVAL_LOSS, help=f"the low-noise metric the targets refer to (default {m.EVAL_LOSS})"
    )


def bootstrap(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap",
        type=int,
        default=DEFAULT_BOOTSTRAP,
        metavar="N",
        help=f"bootstrap replicates of the 90%% intervals (default {DEFAULT_BOOTSTRAP})",
    )


def seed(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--seed", type=int, default=0, metavar="S", help="seed of every random draw: the same seed, the same numbers "
        "(default 0)"
    )  # fmt: skip


def check_seed(seed: int) -> None:
    """``--seed``'s value, before any compute (numpy's generators take 0 <= seed < 2**63 here)."""
    if not 0 <= seed < 2**63:
        raise UserError(f"--seed must be an integer >= 0, got {seed}")


def out(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        metavar="DIR",
        help="output directory, created if missing (default: SWEEP_DIR/analysis)",
    )


def no_mlflow(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-mlflow", action="store_true", help="do not log the results to the sweep's MLflow parent run")


def overrides(p: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` of the commands that read a YAML (a spec or a trial config)."""
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the YAML, dotted, e.g. --set fixed.seeds=[3,4,5] (repeatable; on `sweep --resume` "
        "only an adaptive sweep's nuisance.goal.* and nuisance.budget.*)",
    )


def resume(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run: give its directory, or the YAML it was started with",
    )


def spec_to_run(args: argparse.Namespace, load, restore, *, what: str, command: str, started=None):
    """The spec ``bcrit <command> SPEC|DIR [--set ...] [--resume]`` runs, by ``--set``/``--resume``'s rules: a
    directory only with ``--resume`` and without ``--set`` (``restore(dir)``: the spec it was started with); a YAML
    (``load(path, overrides)``), which with ``--resume`` must equal the spec its storage directory was started with.
    ``started(dir)``: whether that directory holds a started run to compare against (default: always -- ``restore``
    then says why not). ``what``: "sweep" or "study", for the messages."""
    if os.path.isdir(args.spec):
        if not args.resume:
            raise UserError(f"{args.spec} is a directory; pass a spec YAML, or --resume to continue that {what}")
        if args.set:
            raise UserError(f"--set cannot change a {what} being resumed; start a new {what} instead")
        return restore(args.spec)
    spec = load(args.spec, args.set)
    if not args.resume or (started is not None and not started(spec.sweep_dir)):
        return spec
    saved = restore(spec.sweep_dir)
    if saved.to_yaml() != spec.to_yaml():
        raise UserError(
            f"{args.spec} differs from the spec {spec.sweep_dir} was started with; resume it with "
            f"`bcrit {command} {getattr(spec, 'storage_uri', None) or spec.sweep_dir} --resume`, or start the new "
            "spec in another storage directory"
        )
    return saved


def verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show Ray's own INFO logs and tables, which bcrit hides by default",
    )
