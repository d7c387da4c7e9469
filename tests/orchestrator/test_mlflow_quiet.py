"""A sweep's terminal shows bcrit's lines only: MLflow prints "View run ... / View experiment ..." on stdout for
every run it ends on a tracking server (not on a local store); the tracker ends its trial runs and the parent
without them (``bcrit sweep`` prints the parent's link once itself)."""

from __future__ import annotations

import os

import pytest

from analysis.core import metrics as M
from orchestrator.records.mlflow_tracking import QUIET_URLS_ENV, MLflowTracking

CFG = {"batch_size": 16, "micro_batch_size": 16, "grad_accum": 1, "num_workers": 0, "lr": 0.5, "seed": 0}


def _end_a_sweep(uri: str, sweep_dir: str) -> MLflowTracking:
    """Two trial runs and their parent, ended as a sweep ends them: one trial by its result, the rest by close."""
    t = MLflowTracking(uri, "quiet", "q", sweep_dir, "name: q\n")
    t.open_parent()
    t.child("t1", CFG)
    t.child("t2", {**CFG, "lr": 1.5})
    t.end_child("t1", M.STATUS_REACHED_TARGET, "FINISHED")
    t.close("FINISHED")
    return t


def _statuses(uri: str, experiment_id: str) -> list[str]:
    from mlflow.tracking import MlflowClient

    return sorted(r.info.status for r in MlflowClient(uri).search_runs([experiment_id]))


def test_runs_end_with_mlflow_told_not_to_print_links(monkeypatch):
    """Fast (no server: a local store prints nothing anyway): each set_terminated runs with the variable MLflow
    reads, and the variable is as before afterwards."""
    from orchestrator.records.mlflow_tracking import quiet_end

    seen = []

    class Client:
        def set_terminated(self, run_id, status=None):
            seen.append((run_id, status, os.environ.get(QUIET_URLS_ENV)))

    monkeypatch.delenv(QUIET_URLS_ENV, raising=False)
    quiet_end(Client(), "r1", "FINISHED")
    assert seen == [("r1", "FINISHED", "true")] and QUIET_URLS_ENV not in os.environ
    monkeypatch.setenv(QUIET_URLS_ENV, "false")
    quiet_end(Client(), "r2", "KILLED")
    assert seen[-1] == ("r2", "KILLED", "true") and os.environ[QUIET_URLS_ENV] == "false"


@pytest.mark.slow
def test_ending_runs_on_a_tracking_server_prints_no_run_links(tmp_path, capfd, monkeypatch):
    from mlflow.tracking import MlflowClient

    from orchestrator.features.rehearsal.local_services import mlflow_server

    monkeypatch.delenv(QUIET_URLS_ENV, raising=False)
    with mlflow_server(str(tmp_path / "server")) as uri:
        capfd.readouterr()
        t = _end_a_sweep(uri, str(tmp_path / "sweep"))
        out = capfd.readouterr().out
        assert "View run" not in out and "View experiment" not in out, out
        assert _statuses(uri, t.experiment_id) == ["FINISHED"] * 3
        assert QUIET_URLS_ENV not in os.environ  # held back for the call only, not for the user's own runs
        client = MlflowClient(uri)  # the control: MLflow's own set_terminated prints them here
        client.set_terminated(client.create_run(t.experiment_id).info.run_id)
        assert "View run" in capfd.readouterr().out
