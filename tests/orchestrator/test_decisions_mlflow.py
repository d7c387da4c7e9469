"""`bcrit recommend`, `allocate` and `schedule` read a sweep from an MLflow experiment wherever `bcrit analyze` does
(`--mlflow-experiment NAME [--tracking-uri URI] [--parent-run-id ID] --out DIR`), with the same answers as from the
sweep directory."""

from __future__ import annotations

import json
import shutil

import numpy as np

from orchestrator.cli.main import main
from tests.oracles.sweep_dir import write_sweep_dir
from tests.oracles.synth_splits import synth_split_runs


def _log_sweep(client, exp: str, runs) -> str:
    """The sweep as MLflow nested runs (params, tags, metric histories), as the orchestrator logs it."""
    from mlflow.entities import Metric, Param

    parent = client.create_run(exp, run_name="sweep").info.run_id
    rows = runs.metrics.to_pylist()
    keys = ("batch_size", "micro_batch_size", "grad_accum", "num_workers", "lr", "seed")
    for t in runs.trials.to_pylist():
        tags = {"mlflow.parentRunId": parent, "trial_id": t["trial_id"], "status": t["status"]}
        run = client.create_run(exp, run_name=t["trial_id"], tags=tags).info.run_id
        mets = [
            Metric(r["metric"], r["value"], 1000 + r["step"], r["step"]) for r in rows if r["trial_id"] == t["trial_id"]
        ]
        for i in range(0, len(mets), 1000):  # MLflow takes at most 1000 metrics per batch
            client.log_batch(run, metrics=mets[i : i + 1000], params=[] if i else [Param(k, str(t[k])) for k in keys])
        client.set_terminated(run, "FINISHED")
    client.set_terminated(parent, "FINISHED")
    return parent


def test_decisions_from_an_mlflow_experiment(tmp_path, empty_mlflow_db, capsys):
    from mlflow.tracking import MlflowClient

    runs = synth_split_runs(np.random.default_rng(0), seeds=1, n_evals=40)
    shutil.copy(empty_mlflow_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    parent = _log_sweep(client, exp, runs)
    write_sweep_dir(runs, tmp_path / "s")
    src = ["--mlflow-experiment", "e", "--tracking-uri", uri]

    rec = ["--target", "0.3", "--bootstrap", "20"]
    assert main(["recommend", str(tmp_path / "s"), *rec, "--no-mlflow", "--out", str(tmp_path / "r1")]) == 0
    assert main(["recommend", *src, *rec, "--out", str(tmp_path / "r2")]) == 0
    a, b = (json.loads((tmp_path / d / "recommend.json").read_text()) for d in ("r1", "r2"))
    assert a["fastest"] == b["fastest"] and a["cheapest"] == b["cheapest"]
    assert f"logged to MLflow run {parent}" in capsys.readouterr().out

    assert main(["allocate", *src, "--target", "0.3", "--bootstrap", "0", "--out", str(tmp_path / "al")]) == 0
    assert json.loads((tmp_path / "al" / "allocation.json").read_text())["target"] == 0.3

    assert main(["schedule", *src, "--out", str(tmp_path / "sc")]) == 2  # not analysed yet: says how
    assert "run `bcrit analyze --mlflow-experiment e --out DIR` first" in capsys.readouterr().err
    ana = ["analyze", *src, "--targets", "0.4,0.3", "--bootstrap", "0", "--no-plots", "--out", str(tmp_path / "an")]
    assert main(ana) == 0
    assert main(["schedule", *src, "--out", str(tmp_path / "sc")]) == 0
    got = json.loads((tmp_path / "sc" / "schedule.json").read_text())
    assert set(got["flags"]) == {"0.4", "0.3"} and got["trial"]["batch_size"] >= 1

    for cmd in ("recommend", "allocate", "schedule"):  # neither or both sources; MLflow without --out
        assert main([cmd]) == 2
        assert "give exactly one of SWEEP_DIR or --mlflow-experiment NAME" in capsys.readouterr().err
        assert main([cmd, *src]) == 2
        assert "--mlflow-experiment needs --out DIR" in capsys.readouterr().err
