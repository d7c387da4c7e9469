"""The ``bcrit`` command line. Sub-commands import their heavy dependencies lazily, so ``bcrit analyze`` never
loads torch or ray. User mistakes print one line ``bcrit <cmd>: error: ...`` and exit with code 2."""

from __future__ import annotations

import argparse
import sys

from orchestrator.overrides import UserError


def _train_parser(sub) -> None:
    p = sub.add_parser("train", help="run one DiT trial outside any sweep and print its summary")
    p.add_argument("config", help="trial config YAML (keys of trainables.config.TrialConfig)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--name", default=None, help="run name (a run of the same name in --storage resumes)")
    p.add_argument("--storage", default="runs", help="Ray Train storage path for checkpoints (default: ./runs)")
    p.add_argument("--verbose", action="store_true", help="Ray Train's INFO logs (worker group, checkpoints)")
    p.set_defaults(func=_train)


def _train(args) -> int:
    from orchestrator.train_cmd import train_command

    return train_command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bcrit", description="Critical batch size of diffusion transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    for module in (
        "orchestrator.sweep_cmd",
        "analysis.cli",
        "orchestrator.probe_cmd",
        "orchestrator.branch_cmd",
        "orchestrator.pack_cmd",
        "orchestrator.migrate_cmd",
        "orchestrator.cluster_check",
    ):
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError as e:
            if getattr(e, "name", None) == module:
                continue  # sub-command not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"bcrit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bcrit {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
