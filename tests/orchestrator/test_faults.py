"""Faults the sweep must survive (issue 4's done-criteria), kept cheap with the quadratic workload:
the driver killed mid-sweep (``--resume`` completes it), a worker process killed mid-trial (Ray Train restarts it
from its checkpoint), and 2-worker trials spanning the nodes of a multi-node cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq
import pytest
from ray.tune import Callback

from analysis.core import metrics as M
from analysis.sources.schema import validate_metrics, validate_trials
from orchestrator.cli.main import main
from orchestrator.specs.sweep_spec import parse_spec
from orchestrator.sweep import build_tuner, run
from tests.orchestrator.conftest import (
    eval_steps_by_trial,
    kill_sweep_midway,
    mlflow_runs,
    quadratic_spec,
    write_spec,
)

pytestmark = pytest.mark.ray
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def slow_spec(tmp_path, **fixed) -> dict:
    """Trials of ~2-4 s (an artificial delay per step) that end by budget, with checkpoints every 10 steps."""
    spec = quadratic_spec(tmp_path)
    spec["fixed"] = {
        "dim": 20,
        "eval_every": 1,
        "report_every": 5,
        "checkpoint_every": 10,
        "step_seconds": 0.03,
        **fixed,
    }
    spec["stopping"] = {"target_loss": 1e-6, "max_steps": 80, "divergence_factor": 10.0}
    return spec


def check_consistent(sweep_dir: str, n_trials: int) -> dict[str, list[int]]:
    """One terminal child per trial, rows without gaps or duplicates in Parquet and MLflow alike."""
    trials = validate_trials(pq.read_table(os.path.join(sweep_dir, "trials.parquet")))
    metrics = validate_metrics(pq.read_table(os.path.join(sweep_dir, "metrics.parquet")), trials.column("trial_id"))
    assert trials.num_rows == n_trials
    assert set(trials.column("status").to_pylist()) <= set(M.FINAL_STATUSES) - {M.STATUS_FAILED}
    client, parents, children = mlflow_runs(sweep_dir)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == n_trials and all(c.info.status == "FINISHED" for c in children)
    assert len({c.data.tags["trial_id"] for c in children}) == n_trials
    steps = eval_steps_by_trial(metrics)
    last = dict(zip(trials.column("trial_id").to_pylist(), trials.column("step").to_pylist(), strict=True))
    values = eval_values_by_trial(metrics)
    for c in children:
        tid = c.data.tags["trial_id"]
        assert steps[tid] == list(range(0, int(last[tid]) + 1)), tid
        history = sorted((m.step, m.value) for m in client.get_metric_history(c.info.run_id, M.EVAL_LOSS))
        assert [s for s, _ in history] == steps[tid], tid
        assert history == values[tid], tid  # the values too: a restored trial logs what it computed, once
    return steps


def eval_values_by_trial(metrics_table) -> dict[str, list[tuple[int, float]]]:
    """trial_id -> sorted (step, value) of its eval/loss rows in metrics.parquet."""
    out: dict[str, list[tuple[int, float]]] = {}
    cols = [metrics_table.column(k).to_pylist() for k in ("trial_id", "step", "metric", "value")]
    for tid, step, name, value in zip(*cols, strict=True):
        if name == M.EVAL_LOSS:
            out.setdefault(tid, []).append((step, value))
    return {tid: sorted(v) for tid, v in out.items()}


def test_driver_killed_mid_sweep_then_resume(tmp_path, ray_local, no_ray_address):
    spec = slow_spec(tmp_path)  # trials still running at the kill, which comes from the driver itself (no race)
    spec["scientific"]["batch_sizes"] = [16]  # 2 trials (2 lrs)
    assert kill_sweep_midway(tmp_path, write_spec(tmp_path, spec), parts_needed=4) >= 4
    assert main(["sweep", str(tmp_path / "sweep"), "--resume"]) == 0
    check_consistent(str(tmp_path / "sweep"), 2)


class KillWorkerOnce(Callback):
    """Kills the Train worker process of the first trial that passes ``at_step`` (SIGKILL, as the OOM killer)."""

    def __init__(self, at_step: int):
        self.at_step, self.killed_pid = at_step, None

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.killed_pid is None and result.get(M.STEP, 0) >= self.at_step:
            self.killed_pid = result["worker_pid"]
            os.kill(self.killed_pid, signal.SIGKILL)


def test_worker_killed_mid_trial_resumes_from_checkpoint(tmp_path, ray_local, no_ray_address):
    spec = slow_spec(tmp_path)
    spec["scientific"] = {"batch_sizes": [16], "splits": [{"grad_accum": 1, "num_workers": 1}]}
    spec["nuisance"] = {"search": "grid", "lr": [0.5]}
    spec = parse_spec(spec)
    killer = KillWorkerOnce(at_step=35)
    results = run(build_tuner(spec, extra_callbacks=[killer], trial_retries=0), spec)
    assert killer.killed_pid is not None
    (result,) = results
    assert result.error is None  # Ray Train restarted the worker; Tune never saw a failure
    assert result.metrics["worker_pid"] != killer.killed_pid
    assert result.metrics["status"] == M.STATUS_BUDGET_SPENT and result.metrics[M.STEP] == 80
    check_consistent(spec.sweep_dir, 1)


MULTI_NODE = textwrap.dedent(
    """
    import json, sys
    import ray
    from ray.cluster_utils import Cluster
    from ray._private.state import actors as actor_table
    from orchestrator.specs.sweep_spec import parse_spec
    from orchestrator.sweep import build_tuner, run

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    spec = parse_spec(json.loads(sys.argv[1]))
    results = run(build_tuner(spec), spec)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    # the GCS actor table (dead actors included, with their node): no dashboard needed, unlike ray.util.state
    workers = [a for a in actor_table().values() if a["ActorClassName"].endswith("RayTrainWorker")]
    print(json.dumps({"nodes": len(nodes), "cpus": [n["Resources"].get("CPU") for n in nodes],
                      "errors": [str(r.error) for r in results if r.error], "n": len(results),
                      "workers": len(workers), "worker_nodes": len({w["Address"]["NodeID"] for w in workers})}))
    ray.shutdown()
    cluster.shutdown()
    """
)


def test_two_worker_trials_span_nodes(tmp_path, no_ray_address):
    # 3 nodes of 1 CPU; a 2-worker trial holds 3 one-CPU bundles (Tune driver + 2 Train workers), so its two
    # workers run on two different nodes: DDP (gloo) across nodes.
    spec = slow_spec(tmp_path, step_seconds=0.0)
    spec["scientific"] = {"batch_sizes": [32], "splits": [{"grad_accum": 1, "num_workers": 2}]}
    spec["nuisance"] = {"search": "grid", "lr": [0.5]}
    spec["stopping"]["max_steps"] = 20
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", MULTI_NODE, json.dumps(spec)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    # the trial's two Train workers (Ray's state API keeps dead actors with their node) ran on two different nodes
    assert summary == {"nodes": 3, "cpus": [1.0, 1.0, 1.0], "errors": [], "n": 1, "workers": 2, "worker_nodes": 2}
    check_consistent(str(tmp_path / "sweep"), 1)
