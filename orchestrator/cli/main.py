"""The ``bcrit`` command line: every sub-command is ``orchestrator/<name>_cmd.py`` (``check-cluster``:
``orchestrator/cli/check_cluster_cmd.py``) with a ``register(sub)`` that adds its parser and its function. Modules
import
their heavy dependencies inside the command function, so ``bcrit analyze`` never loads torch or ray. User mistakes
print one line ``bcrit <cmd>: error: ...`` and exit with code 2."""

from __future__ import annotations

import argparse
import sys

from analysis.core.bcrit_error import BcritError
from orchestrator.cli import (
    allocate_cmd,
    analyze_cmd,
    branch_cmd,
    check_cluster_cmd,
    migrate_cmd,
    pack_cmd,
    probe_cmd,
    recommend_cmd,
    schedule_cmd,
    sweep_cmd,
    train_cmd,
)

COMMANDS = (
    train_cmd,
    sweep_cmd,
    analyze_cmd,
    recommend_cmd,
    schedule_cmd,
    allocate_cmd,
    probe_cmd,
    branch_cmd,
    pack_cmd,
    migrate_cmd,
    check_cluster_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bcrit", description="Critical batch size of diffusion transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "uses_ray", False):  # train, sweep, branch, check-cluster: set by their register()
        from orchestrator.cluster.ray_version import ray_version_warning

        warning = ray_version_warning()
        if warning:
            print(warning, file=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except BcritError as e:  # every user mistake, whichever package raised it: one line, exit 2
        print(f"bcrit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bcrit {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
