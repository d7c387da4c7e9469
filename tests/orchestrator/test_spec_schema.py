"""The published JSON Schema (``bcrit schema``, docs/schema/): current with the typed models, and named by every
shipped example of its kind, which validates against the model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.schema_cmd import KINDS, schema_text
from orchestrator.specs.branch_models import BranchModel
from orchestrator.specs.models import validate
from orchestrator.specs.sweep_models import SweepModel
from orchestrator.specs.yaml_overrides import load_yaml

ROOT = Path(__file__).parents[2]
MODELS = {"sweep": SweepModel, "branch": BranchModel}
UNMODELLED = {"trial.yaml"}  # the trial config: no model yet


@pytest.mark.parametrize("kind", KINDS)
def test_the_committed_schema_is_the_models(kind):
    path = ROOT / "docs" / "schema" / f"{kind}.schema.json"
    assert path.read_text() == schema_text(kind), (
        f"{path.relative_to(ROOT)} is stale; rewrite it: bcrit schema {kind} > docs/schema/{kind}.schema.json"
    )


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_every_example_names_its_schema_and_validates(example):
    if example in UNMODELLED:
        pytest.skip("no typed model for this spec kind yet")
    path = ROOT / "examples" / example
    kind = "branch" if example.startswith("branched-") else "sweep"
    assert path.read_text().splitlines()[0] == f"# yaml-language-server: $schema=../docs/schema/{kind}.schema.json"
    validate(MODELS[kind], load_yaml(str(path)), "", scoped=True)


def test_bcrit_schema_prints_it():
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "schema", "branch"], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout  # fmt: skip
    assert out == schema_text("branch")
