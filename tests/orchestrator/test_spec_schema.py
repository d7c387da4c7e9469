"""The published JSON Schema (``bcrit schema``, docs/schema/): current with the typed models (the trial config's:
with its dataclass and bounds table), and named by every shipped example of its kind, which validates against the
model (the trial config: against its schema and `TrialConfig` itself)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.schema_cmd import KINDS, schema, schema_text
from orchestrator.specs.branch_models import BranchModel
from orchestrator.specs.models import validate
from orchestrator.specs.sweep_models import SweepModel
from orchestrator.specs.yaml_overrides import load_yaml
from trainables.config import TrialConfig

ROOT = Path(__file__).parents[2]
MODELS = {"sweep": SweepModel, "branch": BranchModel}
TRIALS = {"trial.yaml"}  # the trial configs (bcrit train); the others are sweep or branched specs


@pytest.mark.parametrize("kind", KINDS)
def test_the_committed_schema_is_the_models(kind):
    path = ROOT / "docs" / "schema" / f"{kind}.schema.json"
    assert path.read_text() == schema_text(kind), (
        f"{path.relative_to(ROOT)} is stale; rewrite it: bcrit schema {kind} > docs/schema/{kind}.schema.json"
    )


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_every_example_names_its_schema_and_validates(example):
    path = ROOT / "examples" / example
    kind = "trial" if example in TRIALS else "branch" if example.startswith("branched-") else "sweep"
    assert path.read_text().splitlines()[0] == f"# yaml-language-server: $schema=../docs/schema/{kind}.schema.json"
    if kind == "trial":
        data = load_yaml(str(path))
        TrialConfig.from_dict(data)
        jsonschema = pytest.importorskip("jsonschema")
        jsonschema.validate(data, schema("trial"))
    else:
        validate(MODELS[kind], load_yaml(str(path)), "", scoped=True)


def test_the_trial_schema_carries_the_bounds():
    """The trial schema closes the keys and narrows each field as its row of TrialConfig.BOUNDS does; a value the
    config rejects by one field alone is rejected by the schema too."""
    jsonschema = pytest.importorskip("jsonschema")
    s = schema("trial")
    assert set(s["properties"]) == set(TrialConfig.BOUNDS)
    assert s["properties"]["lr"]["exclusiveMinimum"] == 0
    assert s["properties"]["timestep_sampling"]["enum"] == ["uniform", "noise", "loss"]
    ok = {"batch_size": 64, "micro_batch_size": 16}
    jsonschema.validate(ok, s)
    for bad in ({"lr": 0}, {"beta1": 1.0}, {"preset": "DiT-Q/9"}, {"no_such_key": 1}, {"keep_steps": [-1]},
                {"grad_accum": 0}, {"timestep_sampling": "loud"}, {"dataset": ""}):  # fmt: skip
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**ok, **bad}, s)
    jsonschema.validate({**ok, "grad_accum": None, "target_loss": None}, s)


def test_bcrit_schema_prints_it():
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "schema", "branch"], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout  # fmt: skip
    assert out == schema_text("branch")
