"""Loaders: Parquet round trip, and MLflow nested runs in a real local SQLite store give the same tables."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis.core import metrics as m
from analysis.reporting.publish import log_analysis
from analysis.reporting.report import analyze
from analysis.sources.loaders import load_mlflow, load_sweep_dir, runs_from_tables
from analysis.sources.schema import RunsTableError
from tests.oracles.sweep_dir import write_sweep_dir
from tests.oracles.synth_runs import synth_runs


def test_parquet_round_trip(tmp_path):
    runs = synth_runs(np.random.default_rng(0), seeds=1, bins=1)
    write_sweep_dir(runs, tmp_path)
    back = load_sweep_dir(tmp_path)
    assert back.trial_ids == runs.trial_ids
    for name in (m.EVAL_LOSS, m.per_bin(m.EVAL_LOSS_BIN, 0)):
        a, b = runs.series(name), back.series(name)
        np.testing.assert_array_equal(a.trial, b.trial)
        np.testing.assert_array_equal(a.step, b.step)
        np.testing.assert_array_equal(a.value, b.value)
    assert back.series("nope").trial.size == 0


TRIALS = [  # trial_id, batch_size, lr, status, eval losses at steps 0, 10, 20
    ("t0", 8, 0.1, m.STATUS_REACHED_TARGET, [1.0, 0.5, 0.2]),
    ("t1", 16, 0.2, m.STATUS_DIVERGED, [1.0, 2.0, 9.0]),
    ("t2", 32, 0.1, None, [1.0, 0.7, 0.4]),  # no status tag: derived from the run state
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):  # one SQLite store for the module: creating its tables takes seconds
    from mlflow.tracking import MlflowClient

    tmp_path = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("sweep", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, run_name="sweep-parent")
    for tid, bs, lr, status, losses in TRIALS:
        tags = {"mlflow.parentRunId": parent.info.run_id, "trial_id": tid}
        if status:
            tags["status"] = status
        run = client.create_run(exp, run_name=f"run-{tid}", tags=tags)
        params = {"batch_size": bs, "micro_batch_size": bs // 2, "grad_accum": 2, "num_workers": 1}
        if tid == "t1":  # a scheduled trial: B = 32 once 10 steps are done (analysis.core.stages)
            params["batch_schedule"] = "[[10, 32]]"
        for k, v in {**params, "lr": lr, "seed": 0, "warmup": 5}.items():
            client.log_param(run.info.run_id, k, v)
        for i, v in enumerate(losses):
            client.log_metric(run.info.run_id, m.EVAL_LOSS, v, step=10 * i, timestamp=1000 * i + 1)
        client.log_metric(run.info.run_id, m.EVAL_LOSS, losses[-1] - 0.01, step=20, timestamp=5000)  # re-logged
        client.set_terminated(run.info.run_id, "FINISHED")
    lone = client.create_run(exp, run_name="unrelated")  # a run without children is not a parent
    client.set_terminated(lone.info.run_id)
    return uri, parent.info.run_id


def test_load_mlflow_nested_runs(store):
    import mlflow

    uri, parent = store
    global_uri = mlflow.get_tracking_uri()
    runs = load_mlflow("sweep", tracking_uri=uri)
    assert mlflow.get_tracking_uri() == global_uri != uri  # the loader leaves the process-wide URI alone
    assert runs.parent_run_id == parent and runs.tracking_uri == uri
    rows = runs.trials.sort_by("trial_id").to_pylist()
    assert [r["trial_id"] for r in rows] == ["t0", "t1", "t2"]
    assert [r["batch_size"] for r in rows] == [8, 16, 32]
    assert [r["status"] for r in rows] == [m.STATUS_REACHED_TARGET, m.STATUS_DIVERGED, m.STATUS_BUDGET_SPENT]
    assert rows[0]["micro_batch_size"] == 4 and rows[0]["grad_accum"] == 2 and rows[0]["warmup"] == "5"
    t0 = runs.trial_ids.index("t0")
    s = runs.series(m.EVAL_LOSS)
    sel = s.trial == t0
    np.testing.assert_array_equal(s.step[sel], [0, 10, 20])
    np.testing.assert_allclose(s.value[sel], [1.0, 0.5, 0.19])  # the re-logged step keeps the latest value
    ex = runs.metrics.filter(runs.metrics.column("trial_id").to_numpy(zero_copy_only=False) == "t2")
    assert ex.column("examples").to_pylist() == [0, 320, 640]  # examples = step * batch_size
    ex = runs.metrics.filter(runs.metrics.column("trial_id").to_numpy(zero_copy_only=False) == "t1")
    assert ex.column("examples").to_pylist() == [0, 160, 480]  # summed over its stages: 10 x 16, then 10 x 32
    assert load_mlflow("sweep", tracking_uri=uri, parent_run_id=parent).trial_ids == runs.trial_ids


def test_load_mlflow_errors(store):
    uri, parent = store
    with pytest.raises(RunsTableError, match="experiment 'nope' not found"):
        load_mlflow("nope", tracking_uri=uri)
    with pytest.raises(RunsTableError, match="is not a run of experiment 'sweep'"):
        load_mlflow("sweep", tracking_uri=uri, parent_run_id="0" * 32)  # issue 14: not "has no child runs"


def test_log_analysis_attaches_artifacts_to_parent(store, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, parent = store
    runs = load_mlflow("sweep", tracking_uri=uri)
    out = tmp_path / "report"
    # three batch sizes, one diverged: too few for a fit, so write a report by hand to check the logging
    out.mkdir()
    (out / "bcrit.json").write_text("{}")
    log_analysis(out, uri, parent)
    names = [f.path for f in MlflowClient(uri).list_artifacts(parent, "analysis")]
    assert names == ["analysis/bcrit.json"]
    with pytest.raises(ValueError, match="only batch sizes"):
        analyze(runs, targets=[0.3], out_dir=out, bootstrap=0)


# --- `bcrit analyze --mlflow-experiment` end to end -------------------------------------------------------------
def _log_sweep(client, exp: str, runs, name: str) -> str:
    """Log a sweep as MLflow nested runs (params, tags, metric histories), as the orchestrator does; the parent id."""
    from mlflow.entities import Metric, Param

    parent = client.create_run(exp, run_name=name)
    rows = runs.metrics.to_pylist()
    for t in runs.trials.to_pylist():
        tags = {"mlflow.parentRunId": parent.info.run_id, "trial_id": t["trial_id"], "status": t["status"]}
        run = client.create_run(exp, run_name=t["trial_id"], tags=tags)
        keys = ("batch_size", "micro_batch_size", "grad_accum", "num_workers", "lr", "seed")
        mets = [
            Metric(r["metric"], r["value"], 1000 + r["step"], r["step"]) for r in rows if r["trial_id"] == t["trial_id"]
        ]
        client.log_batch(run.info.run_id, metrics=mets, params=[Param(k, str(t[k])) for k in keys])
        client.set_terminated(run.info.run_id, "FINISHED")
    client.set_terminated(parent.info.run_id, "FINISHED")
    return parent.info.run_id


def test_analyze_from_mlflow_experiment_and_parent_run_id(store, tmp_path, capsys):
    """`--mlflow-experiment` gives the same bcrit.json as the Parquet tables of the same sweep; the default parent
    is the newest one with children, `--parent-run-id` picks another, and the artifacts go to the parent analyzed."""
    from mlflow.tracking import MlflowClient

    from orchestrator.cli.main import main as bcrit

    uri, _ = store
    client = MlflowClient(uri)
    exp = client.create_experiment("analyzed", artifact_location=(tmp_path / "artifacts").as_uri())
    full = synth_runs(
        np.random.default_rng(1), batch_sizes=(32, 64, 128, 256, 512), lr_factors=(0.5, 1.0, 2.0), seeds=1, n_evals=12
    )
    older = _log_sweep(client, exp, full, "full")
    few = full.trials.filter(np.isin(full.trials.column("batch_size").to_numpy(), [32, 64]))
    newer = _log_sweep(
        client,
        exp,
        runs_from_tables(
            few,
            full.metrics.filter(
                np.isin(
                    full.metrics.column("trial_id").to_numpy(zero_copy_only=False), few.column("trial_id").to_pylist()
                )
            ),
        ),
        "two batch sizes",
    )
    args = ["--targets", "0.3,0.2", "--bootstrap", "30", "--no-plots"]

    write_sweep_dir(full, tmp_path / "parquet")
    assert bcrit(["analyze", str(tmp_path / "parquet"), "--out", str(tmp_path / "from_parquet"), *args]) == 0
    base = ["--mlflow-experiment", "analyzed", "--tracking-uri", uri]
    assert (
        bcrit(["analyze", *base, "--out", str(tmp_path / "newest"), *args]) == 2
    )  # the newest parent has 2 batch sizes
    assert "only batch sizes" in capsys.readouterr().err
    assert bcrit(["analyze", *base, "--parent-run-id", older, "--out", str(tmp_path / "from_mlflow"), *args]) == 0
    assert f"logged to MLflow run {older}" in capsys.readouterr().out

    a = json.loads((tmp_path / "from_parquet" / "bcrit.json").read_text())
    b = json.loads((tmp_path / "from_mlflow" / "bcrit.json").read_text())
    assert b["n_trials"] == a["n_trials"] == 15
    assert [t["b_crit"] for t in b["targets"]] == [t["b_crit"] for t in a["targets"]]
    assert [t["points"] for t in b["targets"]] == [t["points"] for t in a["targets"]]
    assert all(t["b_crit"] is not None and len(t["points"]) == 5 for t in b["targets"])  # a real fit, 5 sizes
    logged = {f.path for f in client.list_artifacts(older, "analysis")}
    assert {"analysis/bcrit.json", "analysis/report.md", "analysis/report.html"} <= logged
    assert not client.list_artifacts(newer, "analysis")  # nothing logged to the parent not analyzed
