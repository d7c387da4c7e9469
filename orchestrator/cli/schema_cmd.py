"""``bcrit schema [sweep|branch|trial]``: print the JSON Schema of a spec kind, made from its typed model
(orchestrator.specs.sweep_models.SweepModel, orchestrator.specs.branch_models.BranchModel) or, for a trial config,
from the dataclass (trainables.config.TrialConfig) and its bounds table (the ranges, the closed choices).
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
    """The JSON Schema of spec kind ``kind`` (draft 2020-12, what pydantic's model_json_schema writes)."""
    if kind == "trial":
        return {"$schema": "https://json-schema.org/draft/2020-12/schema", **trial_schema()}
    from orchestrator.specs.branch_models import BranchModel
    from orchestrator.specs.sweep_models import SweepModel

    model = {"sweep": SweepModel, "branch": BranchModel}[kind]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **model.model_json_schema()}


def trial_schema() -> dict:
    """The trial config's schema: pydantic's of the `TrialConfig` dataclass (types, defaults, its docstring),
    closed to unknown keys, each field narrowed by its row of ``TrialConfig.BOUNDS`` (numeric ranges, non-blank
    strings, step lists) and the closed choices (preset, schedule_lr_rule, timestep_sampling). The checks across
    fields (the split, the cadences, the dataset's path) stay `TrialConfig.validate`'s."""
    import pydantic

    from analysis.core.allocation import SAMPLERS
    from analysis.core.lr_rules import LR_RULES
    from trainables.config import TrialConfig
    from trainables.presets import PRESETS

    out = pydantic.TypeAdapter(TrialConfig).json_schema()
    out["additionalProperties"] = False
    choices = {"preset": list(PRESETS), "schedule_lr_rule": list(LR_RULES), "timestep_sampling": list(SAMPLERS)}
    for name, prop in out["properties"].items():
        b = TrialConfig.BOUNDS[name]
        typed = next((t for t in prop.get("anyOf", [prop]) if t.get("type") != "null"), prop)
        if b.kind in ("int", "float"):
            for end, key, open_ in ((b.lo, "minimum", b.lo_open), (b.hi, "maximum", b.hi_open)):
                if end is not None:
                    typed["exclusiveM" + key[1:] if open_ else key] = int(end) if b.kind == "int" else end
        elif b.kind == "str":
            typed.update({"enum": choices[name]} if name in choices else {"minLength": 1})
        elif b.kind == "list":
            typed["items"] = {"type": "integer", "minimum": 0}
        elif b.kind == "stages":
            typed["items"] = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2}
    return out


def schema_text(kind: str) -> str:
    """The schema as the committed file holds it (indented, a final newline)."""
    return json.dumps(schema(kind), indent=2) + "\n"


def schema_command(args) -> int:
    print(schema_text(args.kind), end="")
    return 0
