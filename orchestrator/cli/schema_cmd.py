"""``bcrit schema [sweep|branch|trial]``: print the JSON Schema of a spec kind, made from its typed model
(orchestrator.specs.sweep_models.SweepModel, orchestrator.specs.branch_models.BranchModel, and for a trial config the
pydantic dataclass trainables.config.TrialConfig).
docs/schema/<kind>.schema.json is this output, committed (a test keeps it current), and the shipped examples name it
on their first line so an editor completes keys and marks mistakes."""

from __future__ import annotations

import json

from orchestrator.cli import options

KINDS = ("sweep", "branch", "trial")  # the spec kinds with a schema


def register(sub) -> None:
    """Add the ``schema`` sub-command to ``bcrit``'s sub-parsers."""
    p = options.command(
        sub,
        "schema",
        "print a spec kind's JSON Schema",
        "Print the JSON Schema of a spec kind, for an editor's completion and checks.",
        [
            "bcrit schema          # the sweep spec's schema (bcrit sweep SPEC): docs/schema/sweep.schema.json",
            "bcrit schema branch   # a branched study's (bcrit branch SPEC): docs/schema/branch.schema.json",
            "bcrit schema trial    # a trial config's (bcrit train CONFIG): docs/schema/trial.schema.json",
        ],
    )
    p.add_argument("kind", metavar="KIND", nargs="?", default="sweep", choices=KINDS,
                   help="sweep (bcrit sweep), branch (bcrit branch), trial (bcrit train); default: sweep")  # fmt: skip
    p.set_defaults(func=schema_command)


def schema(kind: str) -> dict:
    """The JSON Schema of spec kind ``kind`` (draft 2020-12, what pydantic writes): of its model, for a trial config
    the `TrialConfig` pydantic dataclass (types, ranges, closed choices, defaults, no unknown keys; the checks
    across fields, its validators, are not in a schema)."""
    import pydantic

    from orchestrator.specs.branch_models import BranchModel
    from orchestrator.specs.sweep_models import SweepModel
    from trainables.config import TrialConfig

    model = {"sweep": SweepModel, "branch": BranchModel, "trial": TrialConfig}[kind]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **pydantic.TypeAdapter(model).json_schema()}


def schema_text(kind: str) -> str:
    """The schema as the committed file holds it (indented, a final newline)."""
    return json.dumps(schema(kind), indent=2) + "\n"


def schema_command(args) -> int:
    print(schema_text(args.kind), end="")
    return 0
