"""The ``bcrit`` command line: every sub-command is ``orchestrator/cli/<name>_cmd.py`` (``check-cluster``:
``orchestrator/cli/check_cluster_cmd.py``) with a ``register(sub)`` that adds its parser (``options.command``: a
one-line description and examples) and its function. Modules import their heavy dependencies inside the command
function, so ``bcrit --help`` and ``bcrit analyze`` never load torch or ray. A command that uses Ray first warns in
one line when the installed Ray is not the tested release (orchestrator/cluster/ray_version.py). User mistakes print
one line ``bcrit <cmd>: error: ...`` and exit with code 2."""

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
    schema_cmd,
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
    schema_cmd,
)


EXAMPLES = """examples:
  bcrit sweep examples/tiny.yaml      # the demo sweep: a tiny DiT on 8x8 digits, a few minutes on a CPU
  bcrit analyze runs/tiny             # its critical batch size: runs/tiny/analysis/report.html
  bcrit recommend runs/tiny           # the fastest and the cheapest way to reach its target loss

bcrit COMMAND --help describes one command; docs/ is the manual."""


def version() -> str:
    """The installed bcrit distribution's version (``importlib.metadata``; unknown when run from a bare checkout)."""
    from importlib import metadata

    try:
        return metadata.version("bcrit")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


class _Version(argparse.Action):
    """``--version``: prints ``bcrit VERSION`` and exits; the version is read only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"bcrit {version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bcrit",
        description="Measure the critical batch size of diffusion transformers.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, help="print the installed bcrit version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
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
