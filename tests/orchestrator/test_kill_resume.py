"""Driver kills of a 2-worker DDP sweep (gloo) at the crash windows of issue 14, then ``bcrit sweep --resume``:
the tables and the MLflow histories equal an unkilled run's row for row (no duplicates, no gaps, one parent).

The kills are injected (``BCRIT_FAULT``, orchestrator.faults: SIGKILL of the driver's whole process group) where a
real kill cannot be timed: right after the MLflow parent run is created, when Tune's callbacks are set up (before
its first experiment-state file), and on a result whose checkpoint Ray Train persisted before the driver wrote
its rows. Slow (a TorchTrainer per run); the same windows are covered fast in test_kill_windows.py."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from analysis.core import metrics as M
from orchestrator.cli.main import main
from orchestrator.records.runs_tables import SPAN_COLUMNS
from tests.oracles.reproducibility import is_system
from tests.orchestrator.conftest import mlflow_runs, quadratic_spec, write_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ddp_spec(tmp_path, name: str) -> dict:
    spec = quadratic_spec(tmp_path)
    spec["scientific"] = {"batch_sizes": [32], "splits": [{"grad_accum": 1, "num_workers": 2}]}
    spec["nuisance"] = {"search": "grid", "lr": [0.5]}
    spec["fixed"] = {"dim": 20, "eval_every": 1, "report_every": 5, "checkpoint_every": 10, "seeds": [0]}
    spec["stopping"] = {"target_loss": 1e-6, "max_steps": 40, "divergence_factor": 10.0}
    spec["storage"] = str(tmp_path / name)
    return spec


CLOCKS = (M.WALL_TIME, M.SECONDS_TO_TARGET, "train_seconds", "startup_seconds")  # MLflow metrics that are times


def outcome(sweep_dir: str) -> dict:
    """What must not depend on kills: the trial rows and metric rows (less wall times, the driver's spans and the
    random trial id), and every MLflow history but the clocks (`CLOCKS`); asserting one FINISHED parent and one
    FINISHED child per trial."""
    trials = pq.read_table(os.path.join(sweep_dir, "trials.parquet")).to_pylist()
    metrics = pq.read_table(os.path.join(sweep_dir, "metrics.parquet"))
    rows = list(zip(*(metrics.column(c).to_pylist() for c in ("step", "examples", "metric", "value")), strict=True))
    rows = [r for r in rows if not is_system(r[2])]  # sys/ rows: the machine's speed and memory, not the result
    assert len(set(rows)) == len(rows), "duplicate rows"
    client, parents, children = mlflow_runs(sweep_dir)
    assert [p.info.status for p in parents] == ["FINISHED"], [p.info.run_id for p in parents]
    assert [c.info.status for c in children] == ["FINISHED"] * len(trials)
    histories = {}
    for c in children:
        for name in c.data.metrics:
            if name in CLOCKS or is_system(name):  # when it ran and how fast, not what it computed
                continue
            hist = sorted((h.step, h.value) for h in client.get_metric_history(c.info.run_id, name))
            assert len({s for s, _ in hist}) == len(hist), f"duplicate MLflow steps of {name}"
            histories[name] = hist
    assert histories[M.EVAL_LOSS] == sorted((s, v) for s, _, n, v in rows if n == M.EVAL_LOSS)
    drop = ("trial_id", "train_seconds", "startup_seconds", *SPAN_COLUMNS)
    return {"trials": [{k: v for k, v in t.items() if k not in drop} for t in trials], "rows": sorted(rows),
            "mlflow": histories}  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory, ray_local):
    tmp = tmp_path_factory.mktemp("ref")
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    assert main(["sweep", write_spec(tmp, ddp_spec(tmp, "sweep"))]) == 0
    return outcome(str(tmp / "sweep"))


@pytest.mark.parametrize("point", ["parent_created", "tune_setup", "result_unrecorded"])
def test_driver_killed_then_resumed_equals_unkilled(tmp_path, reference, ray_local, no_ray_address, point):
    path = write_spec(tmp_path, ddp_spec(tmp_path, "sweep"))
    sweep_dir = str(tmp_path / "sweep")
    env = {**os.environ, "PYTHONPATH": ROOT, "BCRIT_FAULT": point, "BCRIT_FAULT_STEP": "20"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli.main", "sweep", path],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    assert proc.wait(300) == -signal.SIGKILL, "the fault point was never reached"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    state_files = glob.glob(os.path.join(sweep_dir, "tune", "experiment_state-*.json"))
    if point == "result_unrecorded":
        assert state_files and glob.glob(os.path.join(sweep_dir, "train", "*", "checkpoint_*"))
    else:  # the window before Tune's first experiment state
        assert os.path.exists(os.path.join(sweep_dir, "tune", "tuner.pkl")) and not state_files
    assert main(["sweep", sweep_dir, "--resume"]) == 0
    assert outcome(sweep_dir) == reference
