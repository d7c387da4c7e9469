"""Several trials on one GPU, placed by Ray: a simulated cluster whose one worker node holds one fake GPU
(the accelerator-like test hook, ``BCRIT_WORKER_RESOURCES``), trials at ``gpus_per_worker: 0.25``: four run on it at
once, none is refused, every trial finishes (slow: a cluster of real ``ray start`` nodes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from orchestrator.features.rehearsal.local_cluster import LocalCluster
from tests.orchestrator.conftest import write_spec
from tests.orchestrator.test_cluster_nodes import _process_tree
from tests.orchestrator.test_faults import check_consistent, slow_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOK = {"BCRIT_WORKER_RESOURCES": '{"fake_gpu": 1}'}


def train_workers(cluster: LocalCluster) -> int:
    """Live Ray Train workers (``ray::RayTrainWorker``) in the cluster's process trees."""
    children, cmdlines = _process_tree()
    n, stack = 0, [node.proc.pid for node in cluster.nodes if node.alive()]
    while stack:
        pid = stack.pop()
        n += "RayTrainWorker" in cmdlines.get(pid, "")
        stack.extend(children.get(pid, []))
    return n


def test_four_trials_share_one_fake_gpu(tmp_path):
    cluster = LocalCluster(port=6421, head_cpus=8, logs=str(tmp_path / "ray-logs"))
    try:
        cluster.start_head()
        cluster.add_worker(cpus=8, resources={"fake_gpu": 1})
        spec = slow_spec(tmp_path, step_seconds=0.1)
        spec["scientific"] = {
            "batch_sizes": [16, 32, 64],
            "splits": [{"grad_accum": 1, "num_workers": 1}],
            "gpus_per_worker": 0.25,
        }
        spec["nuisance"] = {"search": "grid", "lr": [0.3, 0.5]}
        spec["stopping"]["max_steps"] = 120
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli.main", "sweep", write_spec(tmp_path, spec)],
            env={**cluster.env(**HOOK), "PYTHONPATH": ROOT},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen = []
        deadline = time.monotonic() + 500
        while proc.poll() is None and time.monotonic() < deadline:
            seen.append(train_workers(cluster))
            time.sleep(0.3)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out[-2000:] + err[-3000:]
        assert max(seen) == 4, sorted(set(seen))  # the fraction's limit, reached, never passed
        check_consistent(str(tmp_path / "sweep"), 6)  # none refused, every trial finished
    finally:
        cluster.shutdown()
