"""A branched study analysed from MLflow alone gives the same result as from its directory: the in-process study
(no Ray) is replayed into MLflow through the real tracking callback (parent run + one child run per trial)."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from analysis.features.branched import branch_report
from analysis.sources.loaders import load_mlflow, load_sweep_dir
from analysis.sources.schema import RunsTableError
from orchestrator.features.branched.branch_study import check_branch_spec, parse_branch_spec
from orchestrator.records.mlflow_tracking import MLflowTracking
from tests.orchestrator.branch_inprocess import run_inprocess
from tests.orchestrator.test_branch_quadratic import quadratic_branch_spec


def _replay(spec, uri: str, with_settings: bool = True) -> None:
    """Log the study's trials as the Ray callback does: the parent opens after the settings file is written."""
    import os

    from analysis.sources.schema import BRANCH_SETTINGS_FILE

    ref_cfg, _ = check_branch_spec(spec)
    settings = os.path.join(spec.sweep_dir, BRANCH_SETTINGS_FILE)
    if not with_settings:
        os.rename(settings, settings + ".away")
    tracking = MLflowTracking(uri, "branched", spec.name, spec.sweep_dir, spec.to_yaml())
    tracking.open_parent()
    if not with_settings:
        os.rename(settings + ".away", settings)
    runs = load_sweep_dir(spec.sweep_dir)
    jobs = [("reference", ref_cfg)]
    branches = zip(spec.branches(), spec.branch_configs("reference"), strict=True)
    jobs += [(f"b{p}-k{k:g}-s{s}", c) for (p, k, s), c in branches]
    for tid, cfg in jobs:
        tracking.child(tid, cfg)
        t = runs.metrics.filter(pc.equal(runs.metrics.column("trial_id"), tid)).to_pylist()
        rows = [[r["step"], r["examples"], r["metric"], r["value"], r["wall_time"]] for r in t]
        tracking.log_rows(tid, rows, "budget_spent")
        tracking.end_child(tid, "budget_spent", "FINISHED")
    tracking.close("FINISHED")


@pytest.fixture
def study(tmp_path):
    spec = parse_branch_spec(quadratic_branch_spec(tmp_path, points=[100, 400], multipliers=[2, 4, 8], seeds=[0, 1]))
    run_inprocess(spec)
    return spec


def test_branched_study_from_mlflow_equals_directory(study, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    _replay(study, uri)
    from_dir = branch_report.analyze(load_sweep_dir(study.sweep_dir), bootstrap=50, plots=False)
    runs = load_mlflow("branched", uri)
    assert runs.trials.column("k").to_pylist().count(None) == 1  # the reference's row
    from_mlflow = branch_report.analyze(runs, bootstrap=50, plots=False)
    assert from_mlflow["epsilons"] == [0.02, 0.01, 0.05]  # the study's settings, not the defaults
    assert from_mlflow.pop("source").startswith("mlflow:branched/")
    from_dir.pop("source")
    assert from_mlflow == from_dir


def test_branched_study_in_mlflow_without_settings_is_an_error(study, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    _replay(study, uri, with_settings=False)
    with pytest.raises(RunsTableError, match="without its settings"):
        branch_report.analyze(load_mlflow("branched", uri), bootstrap=50, plots=False)
