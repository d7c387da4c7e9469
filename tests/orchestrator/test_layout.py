"""One object knows a sweep's layout (orchestrator.storage.layout): every path of a sweep, local or at a URI, comes
from it, and no other module spells a file name of the sweep directory."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from orchestrator.storage import layout as L
from orchestrator.storage.layout import SweepLayout

ROOT = Path(__file__).resolve().parents[2]


def test_a_directory_sweep_keeps_everything_in_its_directory(tmp_path):
    lay = SweepLayout(str(tmp_path / "s"))
    assert lay.spec == os.path.join(tmp_path, "s", L.SPEC_FILE)
    assert lay.parent == os.path.join(tmp_path, "s", L.PARENT_FILE)
    assert lay.tune == os.path.join(tmp_path, "s", L.TUNE_DIR)
    assert lay.train == os.path.join(tmp_path, "s", L.TRAIN_DIR)
    assert lay.mirror is None


def test_a_uri_sweep_keeps_rays_runs_at_the_uri_and_bcrits_files_locally(tmp_path):
    lay = SweepLayout(str(tmp_path / "s"), "s3://bucket/sweeps/a")
    assert lay.tune == "s3://bucket/sweeps/a/tune" and lay.train == "s3://bucket/sweeps/a/train"
    assert lay.mirror == "s3://bucket/sweeps/a/bcrit"
    assert lay.trials == os.path.join(tmp_path, "s", L.TRIALS_FILE)  # bcrit's own files: local, mirrored


def test_the_spec_carries_its_layout(tmp_path):
    from orchestrator.specs.sweep_spec import parse_spec

    raw = {"name": "q", "workload": "quadratic", "storage": str(tmp_path / "s")}
    spec = parse_spec({**raw, "scientific": {"batch_sizes": [8, 16, 32]}, "nuisance": {"search": "grid", "lr": [0.1]}})
    assert spec.layout == SweepLayout(spec.sweep_dir, None)


def test_no_other_module_spells_a_file_name_of_the_sweep_directory():
    names = {L.SPEC_FILE, L.SEARCH_FILE, L.PARENT_FILE, L.DECISIONS_FILE, L.MLFLOW_DB}
    found = []
    for p in sorted((ROOT / "orchestrator").rglob("*.py")):
        if p.name == "layout.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert found == []
