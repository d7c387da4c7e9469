"""The options that several ``bcrit`` sub-commands share, each defined once: one name has one meaning, type,
default and help line in every sub-command (tests/orchestrator/test_cli_options.py walks every parser to check).

A sub-command adds the ones it takes (``options.out(p)``); options only one sub-command has stay in its module.
"""

from __future__ import annotations

import argparse

from analysis.core import metrics as m
from orchestrator.errors import UserError

DEFAULT_BOOTSTRAP = 1000


def command(sub, name: str, summary: str, description: str, examples: list[str]) -> argparse.ArgumentParser:
    """A sub-command's parser: ``summary`` (a few words) in ``bcrit --help``, ``description`` (one sentence) atop
    its own ``--help``, then its options, then ``examples`` (each a command line, optionally with a ``# comment``)."""
    return sub.add_parser(
        name,
        help=summary,
        description=description,
        epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def sweep_dir(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """The positional ``SWEEP_DIR`` of the commands that read a finished sweep."""
    p.add_argument(
        "sweep_dir",
        metavar="SWEEP_DIR",
        nargs="?" if optional else None,
        help="a sweep directory: the spec's storage, holding trials.parquet and metrics.parquet (or the storage "
        "URI, s3://...: read into its local directory first)",
    )


def mlflow_source(p: argparse.ArgumentParser) -> None:
    """The optional ``SWEEP_DIR`` or ``--mlflow-experiment NAME`` (with ``--tracking-uri``, ``--parent-run-id``) of the
    commands that read a finished sweep's runs: ``bcrit analyze``, ``recommend``, ``allocate``."""
    sweep_dir(p, optional=True)
    p.add_argument("--mlflow-experiment", metavar="NAME", help="read the sweep from this MLflow experiment instead")
    p.add_argument("--tracking-uri", metavar="URI", help="MLflow tracking URI (default: MLflow's own default)")
    p.add_argument("--parent-run-id", metavar="ID", help="the sweep's parent run (default: newest run with child runs)")


def target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        type=float,
        metavar="LOSS",
        help="the target loss (default: the one bcrit analyze quotes in SWEEP_DIR/analysis/bcrit.json, else the "
        "lowest trustworthy automatic target)",
    )


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
        help="override a key of the YAML, dotted, e.g. --set fixed.seeds=[3,4,5] (repeatable; with sweep --resume "
        "only an adaptive sweep's nuisance.goal.* and nuisance.budget.*)",
    )


def resume(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run: give its directory, or the YAML it was started with",
    )


def verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show Ray's own INFO logs and tables, which bcrit hides by default",
    )


def dry_run(p: argparse.ArgumentParser) -> None:
    """``--dry-run`` and ``--throughput-from`` of the commands that launch trials (``sweep``, ``branch``)."""
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the spec and print the plan (trials, concurrency, steps, examples, time) without running it; "
        "writes nothing",
    )
    p.add_argument(
        "--throughput-from",
        metavar="SWEEP_DIR",
        help="with --dry-run: predict the time from this past sweep's tables (same workload, preset, dataset, device)",
    )


def check_dry_run(args) -> None:
    """``--throughput-from`` only with ``--dry-run``; ``--dry-run`` plans a new run (a spec YAML), not a resume."""
    if args.throughput_from and not args.dry_run:
        raise UserError("--throughput-from goes with --dry-run")
    if args.dry_run and args.resume:
        raise UserError("--dry-run plans a new run from a spec YAML; drop --resume")
