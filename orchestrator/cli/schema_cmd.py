"""``bcrit schema [sweep|branch]``: print the JSON Schema of a spec kind, made from its typed model
(orchestrator.specs.sweep_models.SweepModel, orchestrator.specs.branch_models.BranchModel).
docs/schema/<kind>.schema.json is this output, committed (a test keeps it current), and the shipped examples name it
on their first line so an editor completes keys and marks mistakes."""

from __future__ import annotations

import json

from orchestrator.cli import options

KINDS = ("sweep", "branch")  # the spec kinds with a typed model (the trial config: not yet)


def register(sub) -> None:
    """Add the ``schema`` sub-command to ``bcrit``'s sub-parsers."""
    p = options.command(
        sub,
        "schema",
        "print a spec kind's JSON Schema",
        "Print the JSON Schema of a spec kind, for an editor's completion and checks.",
        [
            "bcrit schema sweep    # the sweep spec's schema (bcrit sweep SPEC): docs/schema/sweep.schema.json",
            "bcrit schema          # the same: sweep is the default",
            "bcrit schema branch   # a branched study's (bcrit branch SPEC): docs/schema/branch.schema.json",
        ],
    )
    p.add_argument("kind", metavar="KIND", nargs="?", default="sweep", choices=KINDS,
                   help="the spec kind: sweep (bcrit sweep) or branch (bcrit branch); default: sweep")  # fmt: skip
    p.set_defaults(func=schema_command)


def schema(kind: str) -> dict:
    """The JSON Schema of spec kind ``kind`` (draft 2020-12, what pydantic's model_json_schema writes)."""
    from orchestrator.specs.branch_models import BranchModel
    from orchestrator.specs.sweep_models import SweepModel

    model = {"sweep": SweepModel, "branch": BranchModel}[kind]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **model.model_json_schema()}


def schema_text(kind: str) -> str:
    """The schema as the committed file holds it (indented, a final newline)."""
    return json.dumps(schema(kind), indent=2) + "\n"


def schema_command(args) -> int:
    print(schema_text(args.kind), end="")
    return 0
