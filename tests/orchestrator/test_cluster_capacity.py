"""What a cluster can hold (orchestrator.cluster.capacity), without Ray: an autoscaling cluster's node types
(cluster.yaml
itself, whose GPU workers scale from 0) make a GPU trial valid while no GPU node runs yet; only what no node type
could ever hold is refused, in one line. The accelerator-like test hook (``BCRIT_WORKER_RESOURCES``) counts in a
trial's needs as GPUs would."""

from __future__ import annotations

import os

import pytest
import yaml

from orchestrator.cluster import capacity as C
from orchestrator.cluster.sizing import max_concurrent, trial_need, worker_bundle
from orchestrator.errors import UserError
from orchestrator.execution.preflight import check_spec
from orchestrator.specs.sweep_spec import parse_spec
from tests.orchestrator.conftest import quadratic_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOK = '{"fake_gpu": 1}'


def test_cluster_yaml_node_types_give_its_largest_size():
    path = os.path.join(ROOT, "cluster.yaml")
    with open(path) as f:
        config = yaml.safe_load(f)
    source, types = C._config_node_types(path)
    assert path in source
    gpu = config["available_node_types"]["gpu_worker"]
    head = config["available_node_types"][config["head_node_type"]]
    most = min(gpu["max_workers"], config["max_workers"])
    assert (gpu["resources"], most) in [({k: int(v) for k, v in r.items()}, n) for r, n in types]
    # at launch: the head alone, no GPU; at its largest: the head and every GPU worker the autoscaler may start
    cap = C.combine(dict(head["resources"]), [dict(head["resources"])], (source, types))
    assert cap.total["GPU"] == most * gpu["resources"]["GPU"]
    assert cap.total["CPU"] == head["resources"]["CPU"] + most * gpu["resources"]["CPU"]
    assert cap.fits_one_node({"CPU": gpu["resources"]["CPU"], "GPU": 1})
    assert not cap.fits_one_node({"CPU": gpu["resources"]["CPU"] + 1, "GPU": 1})


def test_no_node_types_means_the_cluster_as_it_is():
    now = {"CPU": 3.0, "fake_gpu": 2.0}
    cap = C.combine(now, [{"CPU": 1.0}, {"CPU": 2.0, "fake_gpu": 2.0}], None)
    assert cap.total == now and "nodes now" in cap.describe()


def test_unreadable_cluster_config_env_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(C.CONFIG_ENV, str(tmp_path / "missing.yaml"))
    with pytest.raises(UserError, match="BCRIT_CLUSTER_CONFIG=.*cannot read"):
        C._config_node_types()
    (tmp_path / "x.yaml").write_text("a: 1\n")
    monkeypatch.setenv(C.CONFIG_ENV, str(tmp_path / "x.yaml"))
    with pytest.raises(UserError, match="no available_node_types"):
        C._config_node_types()


def autoscaling(gpus_per_node: int, nodes: int, cpus_per_node: int = 4) -> C.Capacity:
    """A head of 2 CPUs now, and a worker type of ``fake_gpu`` nodes that scales from 0 to ``nodes``."""
    head = {"CPU": 2.0}
    worker = {"CPU": float(cpus_per_node), "fake_gpu": float(gpus_per_node)}
    return C.combine(dict(head), [dict(head)], ("test node types", [(head, 1), (worker, nodes)]))


@pytest.fixture
def one_node_storage(monkeypatch):
    """These tests run without Ray: the shared-storage probe (a Ray task per other node) has no other node."""
    from orchestrator.storage import shared_dir as storage

    monkeypatch.setattr(storage, "check_shared_storage", lambda sweep_dir: 0)


def test_cluster_state_is_never_read_from_a_ray_not_joined(monkeypatch, tmp_path):
    """Ray's state API joins whatever /tmp/ray/ray_current_cluster names when Ray is not initialised (a stale
    head of an earlier `ray start` hung CI for 14 minutes that way): both readers refuse instead."""
    import ray

    from orchestrator.storage import shared_dir as storage

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "nodes", lambda: pytest.fail("ray.nodes() called before joining a cluster"))
    with pytest.raises(RuntimeError, match="needs a connected Ray"):
        storage.check_shared_storage(str(tmp_path))
    with pytest.raises(RuntimeError, match="needs a connected Ray"):
        C.capacity()


def spec_with_workers(tmp_path, workers: int, batch: int = 48):
    spec = quadratic_spec(tmp_path)
    spec["scientific"] = {"batch_sizes": [batch], "splits": [{"grad_accum": 1, "num_workers": workers}]}
    return parse_spec(spec)


def test_check_spec_validates_against_node_types_not_the_nodes_of_now(tmp_path, monkeypatch, one_node_storage):
    monkeypatch.setenv("BCRIT_WORKER_RESOURCES", HOOK)
    monkeypatch.setattr(C, "capacity", lambda: autoscaling(gpus_per_node=1, nodes=3))
    # 3 fake_gpu workers: no worker node runs yet, but the autoscaler can start three
    configs = check_spec(spec_with_workers(tmp_path, 3))
    assert trial_need(configs[0])["fake_gpu"] == 3 and worker_bundle(configs[0])["fake_gpu"] == 1
    # 4 workers: more than every node type together could ever hold
    with pytest.raises(UserError, match=r"needs 4 fake_gpus but the Ray cluster at its largest .* has 3"):
        check_spec(spec_with_workers(tmp_path, 4, batch=64))


def test_check_spec_refuses_a_worker_no_node_type_holds(tmp_path, monkeypatch, one_node_storage):
    monkeypatch.setenv("BCRIT_WORKER_RESOURCES", '{"fake_gpu": 2}')  # two per worker; node types hold one each
    monkeypatch.setattr(C, "capacity", lambda: autoscaling(gpus_per_node=1, nodes=8))
    with pytest.raises(UserError, match=r"one worker needs 1 CPU, 2 fake_gpu on one node but no node type"):
        check_spec(spec_with_workers(tmp_path, 2, batch=32))


def test_concurrency_is_sized_for_the_cluster_at_its_largest(monkeypatch):
    monkeypatch.setenv("BCRIT_WORKER_RESOURCES", HOOK)
    cfg = {"num_workers": 2, "cpus_per_worker": 1}
    small, large = autoscaling(gpus_per_node=1, nodes=2), autoscaling(gpus_per_node=1, nodes=6)
    # fake_gpu is what limits: one trial per 2 worker nodes the autoscaler may start
    assert max_concurrent([cfg], small.total) == small.total["fake_gpu"] // 2
    assert max_concurrent([cfg], large.total) == large.total["fake_gpu"] // 2
    monkeypatch.delenv("BCRIT_WORKER_RESOURCES")
    assert "fake_gpu" not in trial_need(cfg)  # the hook unset: a CPU trial asks for CPUs only


def test_an_adaptive_sweep_runs_locally_as_many_trials_as_the_cores_train(tmp_path, monkeypatch):
    """The embedded local Ray holds twice the cores (a Tune driver idles beside its workers), so a grid runs 4
    in-process trials at once on 2 cores; an adaptive sweep runs 2 (each further trial would be chosen without
    the others' results, for no more throughput). On a cluster (RAY_ADDRESS) both run what the cluster holds."""
    from orchestrator.cluster.sizing import compute_slots
    from orchestrator.execution import tuner
    from tests.orchestrator.test_adaptive_sweep import adaptive_quadratic

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(tuner, "sweep_capacity", lambda: {"CPU": 4.0})  # local_cpus() on 2 cores
    adaptive = parse_spec(adaptive_quadratic(tmp_path))
    grid = parse_spec(quadratic_spec(tmp_path))
    assert tuner.sweep_concurrency(grid, grid.trial_configs()) == 4
    assert tuner.sweep_concurrency(adaptive, adaptive.trial_configs()) == 2
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert tuner.sweep_concurrency(adaptive, adaptive.trial_configs()) == 4
    # what one trial trains on: an in-process trial's CPUs, or its Train workers' (not the idle driver's)
    assert compute_slots([{"num_workers": 0, "cpus_per_worker": 1}]) == 2
    assert compute_slots([{"num_workers": 0, "cpus_per_worker": 2}, {"num_workers": 0}]) == 1
    assert compute_slots([{"num_workers": 2, "cpus_per_worker": 1}]) == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert compute_slots([{"num_workers": 2, "cpus_per_worker": 2}]) == 4
    assert compute_slots([{"num_workers": 0, "cpus_per_worker": 32}]) == 1  # never 0
