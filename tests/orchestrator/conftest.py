"""Helpers of the orchestrator tests: small quadratic specs (seconds per trial) and readers of a sweep's stores."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from analysis.core import metrics as M


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


ROOT = Path(__file__).resolve().parents[2]

KILL_ON_CONDITION = textwrap.dedent(
    """
    import os, pathlib, signal, sys
    from ray.tune import Callback
    import orchestrator.execution.tuner
    from orchestrator.cli.main import main

    spec_path, parts, needed, mark = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

    class KillOnCondition(Callback):
        # after bcrit's own callbacks: once `needed` metric parts are on disk, SIGKILL this driver and every
        # process it started, from inside its result handling: the kill always lands mid-sweep, whatever the speed.
        # Tune pickles the run's callbacks with the experiment and restores them on --resume: inert in any other
        # process than the one that made it.
        def __init__(self):
            self.pid = os.getpid()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if os.getpid() != self.pid:
                return
            if len(list(pathlib.Path(parts).glob("*/m-*.parquet"))) >= needed:
                pathlib.Path(mark).touch()
                os.killpg(os.getpgrp(), signal.SIGKILL)

    bcrit_callbacks = orchestrator.execution.tuner.callbacks
    orchestrator.execution.tuner.callbacks = lambda spec, *a, **kw: [*bcrit_callbacks(spec, *a, **kw),
    KillOnCondition()]
    sys.exit(main(["sweep", spec_path]))
    """
)


def kill_sweep_midway(tmp_path, spec_path: str, parts_needed: int = 4, timeout_s: float = 300, sweep_dir=None) -> int:
    """Run `bcrit sweep SPEC` in a child process (its own process group) that SIGKILLs itself and everything it
    started as soon as its driver has handled a result with ``parts_needed`` metric parts on disk. No race against
    trial speed: the kill is triggered by the observed condition, inside the driver. Returns the number of metric
    parts on disk at the kill."""
    parts, mark = Path(sweep_dir or tmp_path / "sweep") / "parts", tmp_path / "killed"
    env = {**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "0.5", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_ON_CONDITION, spec_path, str(parts), str(parts_needed), str(mark)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
    proc.wait(30)
    assert mark.exists() and code == -signal.SIGKILL, f"the sweep ended (exit {code}) before {parts_needed} parts"
    return len(list(parts.glob("*/m-*.parquet")))
