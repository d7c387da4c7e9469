"""``bcrit check-cluster [cluster.yaml]``: the cluster's front door, checked offline before any ``ray up``; the checks
are orchestrator/cluster/config_check.py (each a one-line refusal, exit 2, naming the key and the fix)."""

from __future__ import annotations

import sys

from orchestrator.cli import options
from orchestrator.cluster import config_check as cc
from orchestrator.cluster.config_check import option, shared_mounts, tokens  # noqa: F401 (tests read them here)


def register(sub) -> None:
    """Add the ``check-cluster`` sub-command to ``bcrit``'s sub-parsers."""
    p = options.command(
        sub,
        "check-cluster",
        "check a Ray cluster config before ray up",
        "Check a Ray cluster config offline before ray up (validation, SSH, ports).",
        [
            "bcrit check-cluster                              # ./cluster.yaml",
            "bcrit check-cluster cluster.yaml --spec examples/dit-s2-imagenet.yaml",
        ],
    )
    p.add_argument(
        "config", metavar="CONFIG", nargs="?", default="cluster.yaml", help="cluster config (default: ./cluster.yaml)"
    )
    p.add_argument(
        "--allow-world-ssh",
        action="store_true",
        help="accept SSH from 0.0.0.0/0 or ::/0 (key-only SSH open to the whole internet)",
    )
    p.add_argument(
        "--spec",
        action="append",
        default=[],
        metavar="SPEC",
        help="also check that this sweep or branched-study spec's storage is on a mount every node shares (repeatable)",
    )
    p.set_defaults(func=check_cluster_command, uses_ray=True)


def check_cluster_command(args) -> int:
    cfg = cc.load_config(args.config)
    summary = cc.check_config(cfg, allow_world_ssh=args.allow_world_ssh)
    where = cc.storage_places(cfg, args.spec)
    if summary["world"]:
        print("bcrit check-cluster: warning: SSH is open to the whole internet (--allow-world-ssh)", file=sys.stderr)
    print(
        f"bcrit check-cluster: {args.config} ok: Ray's validation passes; SSH (22) only, from "
        f"{', '.join(summary['cidrs'])} via {', '.join(summary['groups'])}; MLflow and the dashboard on 127.0.0.1 "
        "(ray attach -p 5000, ray dashboard)" + "".join(f"; {spec}: storage {w}" for spec, w in where.items())
    )
    return 0
