"""A sweep and ``bcrit analyze`` tracked to a real ``mlflow server`` over ``http://`` with
proxied artifacts (``--artifacts-destination``), as cluster.yaml starts it on the head: every artifact a client
logs goes through the server into its destination directory, none into the client's own disk. (``bcrit recommend``
reads the quadratic trials' measured step times, ``sys/examples_per_s``.)"""

from __future__ import annotations

import pytest

from tests.orchestrator.conftest import quadratic_spec, write_spec


@pytest.fixture
def mlflow_server(tmp_path_factory):
    """``mlflow server`` on a free loopback port, SQLite store and proxied artifacts; ended at the end."""
    from orchestrator.features.rehearsal.local_services import mlflow_server as server

    root = tmp_path_factory.mktemp("mlflow-server")
    with server(str(root)) as uri:
        yield uri, root / "artifacts"


@pytest.mark.slow
def test_sweep_analyze_recommend_tracked_to_a_server(tmp_path, monkeypatch, capsys, mlflow_server, ray_local):
    from mlflow.tracking import MlflowClient

    from orchestrator.cli.main import main

    uri, artifacts = mlflow_server
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # a client writing artifacts itself would leave ./mlruns or ./mlartifacts here
    spec = quadratic_spec(tmp_path)
    spec["scientific"]["batch_sizes"] = [16, 32, 64]  # the fit needs >= 3 batch sizes
    path = write_spec(tmp_path, spec)
    assert main(["sweep", path]) == 0  # on the session's Ray: shutting it down here broke the tests after this one
    printed = capsys.readouterr().out
    assert f"then open {uri}/#/experiments/" in printed and "mlflow ui --backend-store-uri" not in printed
    sweep = tmp_path / "sweep"
    assert not (sweep / "mlflow.db").exists()  # tracked to the server, not the embedded store

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("test")
    assert exp.artifact_location.startswith("mlflow-artifacts:")  # proxied: the server decides where
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 6  # 3 batch sizes x 2 lrs
    assert all(r.info.status == "FINISHED" for r in runs)
    parent = parents[0].info.run_id
    on_disk = {p.name for p in artifacts.rglob("*") if p.is_file()}
    assert {"sweep_spec.yaml", "summary.json", "trial_config.json"} <= on_disk

    out = tmp_path / "analysis"
    assert main(["analyze", str(sweep), "--out", str(out), "--bootstrap", "20", "--no-plots"]) == 0
    logged = {f.path for f in client.list_artifacts(parent, "analysis")}
    assert "analysis/bcrit.json" in logged
    assert (artifacts / exp.experiment_id / parent / "artifacts" / "analysis" / "bcrit.json").is_file()
    # recommend on the quadratic trials' measured step times, logged to the same parent through the server
    import json

    target = json.loads((out / "bcrit.json").read_text())["targets"][0]["target"]
    rc = main(["recommend", str(sweep), "--target", str(target), "--out", str(out), "--bootstrap", "20"])
    assert rc == 0
    assert "analysis/recommend.json" in {f.path for f in client.list_artifacts(parent, "analysis")}
    assert any(k.startswith("recommend/fastest/time_s/") for k in client.get_run(parent).data.metrics)
    # the same sweep read back from the server alone
    out2 = tmp_path / "analysis-from-server"
    rc = main(["analyze", "--mlflow-experiment", "test", "--tracking-uri", uri, "--out", str(out2), "--bootstrap",
               "20", "--no-plots", "--no-mlflow"])  # fmt: skip
    assert rc == 0 and (out2 / "bcrit.json").is_file()
    assert not any((tmp_path / d).exists() for d in ("mlruns", "mlartifacts"))
