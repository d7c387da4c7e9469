"""Helpers of the orchestrator tests: small quadratic specs (seconds per trial) and readers of a sweep's stores."""

from __future__ import annotations

import collections
import os

import pytest
import yaml

from analysis import metrics as M


def quadratic_spec(tmp_path, **sections) -> dict:
    """A small quadratic sweep spec (2 batch sizes x 2 lrs, in-process), sections replaced by ``sections``."""
    spec = {
        "name": "q",
        "workload": "quadratic",
        "scientific": {"batch_sizes": [16, 64], "splits": [{"grad_accum": 1, "num_workers": 0}]},
        "nuisance": {"search": "grid", "lr": [0.5, 1.5]},
        "fixed": {"dim": 50, "eval_every": 1, "report_every": 5, "checkpoint_every": 10, "seeds": [0]},
        "stopping": {"target_loss": 0.5, "max_steps": 40, "divergence_factor": 10.0},
        "tracking": {"experiment": "test"},
        "storage": str(tmp_path / "sweep"),
    }
    spec.update(sections)
    return spec


def write_spec(tmp_path, spec: dict, name: str = "spec.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def mlflow_runs(sweep_dir: str):
    """(parents, children) of the sweep's embedded MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{os.path.join(sweep_dir, 'mlflow.db')}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id], max_results=5000)]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return client, parents, children


def eval_steps_by_trial(metrics_table) -> dict[str, list[int]]:
    """trial_id -> the steps of its eval/loss rows, in file order."""
    out: dict[str, list[int]] = collections.defaultdict(list)
    for tid, step, name in zip(
        metrics_table.column("trial_id").to_pylist(),
        metrics_table.column("step").to_pylist(),
        metrics_table.column("metric").to_pylist(),
        strict=True,
    ):
        if name == M.EVAL_LOSS:
            out[tid].append(step)
    return out


@pytest.fixture
def no_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
