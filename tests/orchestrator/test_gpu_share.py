"""Several trials per GPU (``scientific.gpus_per_worker``): a worker (or an in-process trial) holds a share of one
GPU; the share is what sizing, the pre-launch check against the cluster's capacity and Ray's placement read."""

from __future__ import annotations

import pytest

from orchestrator.cluster import capacity as C
from orchestrator.cluster.sizing import max_concurrent, trial_bundle, trial_need, worker_bundle
from orchestrator.errors import UserError
from orchestrator.execution.preflight import check_spec
from orchestrator.specs.sweep_spec import parse_spec
from tests.orchestrator.conftest import quadratic_spec
from tests.orchestrator.test_cluster_capacity import autoscaling, one_node_storage  # noqa: F401 (a fixture)
from trainables.config import ConfigError, TrialConfig


def test_a_quarter_gpu_per_worker_runs_four_trials_on_one_gpu():
    for w in (0, 1, 2):
        cfg = {"num_workers": w, "cpus_per_worker": 1, "use_gpu": True, "gpus_per_worker": 0.25}
        assert trial_need(cfg)["GPU"] == pytest.approx(0.25 * max(1, w))
        if w:
            assert worker_bundle(cfg)["GPU"] == 0.25 and "GPU" not in trial_bundle(cfg)
        else:
            assert trial_bundle(cfg)["GPU"] == 0.25  # the in-process trial holds it itself
    one = {"num_workers": 1, "cpus_per_worker": 1, "use_gpu": True, "gpus_per_worker": 0.25}
    assert max_concurrent([one], {"CPU": 64.0, "GPU": 1.0}) == 4
    assert max_concurrent([one], {"CPU": 64.0, "GPU": 2.0}) == 8
    assert max_concurrent([{**one, "gpus_per_worker": 1.0}], {"CPU": 64.0, "GPU": 1.0}) == 1  # as before
    assert max_concurrent([one], {"CPU": 4.0, "GPU": 1.0}) == 2  # the CPUs still count: 2 per trial


def test_the_spec_key_reaches_every_trial_and_bad_values_are_one_line(tmp_path):
    def spec(share):
        s = quadratic_spec(tmp_path)
        s["scientific"] = {**s["scientific"], "gpus_per_worker": share}
        return parse_spec(s)

    assert {c["gpus_per_worker"] for c in spec(0.25).trial_configs()} == {0.25}
    assert all("gpus_per_worker" not in c for c in spec(1).trial_configs())  # the default: configs unchanged
    for bad in (0, 1.5, -0.25, "half", True):
        with pytest.raises(UserError, match=r"scientific.gpus_per_worker must be a share of one device in \(0, 1\]"):
            spec(bad)


def test_a_share_without_a_gpu_is_refused():
    base = {"batch_size": 32, "micro_batch_size": 32, "lr": 1e-3}
    assert TrialConfig(**base, use_gpu=True, gpus_per_worker=0.5).gpus_per_worker == 0.5
    with pytest.raises(ConfigError, match="gpus_per_worker 0.5 shares a GPU but use_gpu is false"):
        TrialConfig(**base, gpus_per_worker=0.5)
    with pytest.raises(ConfigError, match="gpus_per_worker"):
        TrialConfig(**base, use_gpu=True, gpus_per_worker=2)
    with pytest.raises(ConfigError, match="NCCL refuses"):  # two ranks of one trial could land on one GPU
        TrialConfig(**{**base, "micro_batch_size": 16}, num_workers=2, use_gpu=True, gpus_per_worker=0.5)


def test_shares_are_checked_against_the_clusters_capacity(tmp_path, monkeypatch, one_node_storage):  # noqa: F811
    """With the accelerator-like test hook (one fake_gpu per node type), a 2-worker trial at 0.5 of a fake GPU per
    worker fits a cluster whose node types hold 1 fake GPU in all; at 1 per worker it is refused, as today."""
    monkeypatch.setenv("BCRIT_WORKER_RESOURCES", '{"fake_gpu": 1}')
    monkeypatch.setattr(C, "capacity", lambda: autoscaling(gpus_per_node=1, nodes=1))
    s = quadratic_spec(tmp_path)
    s["scientific"] = {"batch_sizes": [32], "splits": [{"grad_accum": 1, "num_workers": 2}], "gpus_per_worker": 0.5}
    configs = check_spec(parse_spec(s))
    assert trial_need(configs[0])["fake_gpu"] == 1.0 and worker_bundle(configs[0])["fake_gpu"] == 0.5
    s["scientific"]["gpus_per_worker"] = 1
    with pytest.raises(UserError, match=r"needs 2 fake_gpus but the Ray cluster at its largest .* has 1"):
        check_spec(parse_spec(s))


def test_the_train_workers_ask_ray_for_their_share(tmp_path):
    from trainables.trial import build_trainer

    cfg = TrialConfig(batch_size=32, micro_batch_size=32, num_workers=1, lr=1e-3, use_gpu=True, gpus_per_worker=0.25)
    trainer = build_trainer(cfg, name="share", storage_path=str(tmp_path))
    assert trainer.scaling_config.resources_per_worker["GPU"] == 0.25
