import pytest

from trainables.config import ConfigError, TrialConfig
from trainables.trial import check_trial


def test_defaults_and_derived_accum():
    c = TrialConfig(batch_size=64, micro_batch_size=8, num_workers=2)
    assert c.accum == 4 and c.to_dict()["grad_accum"] == 4


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=30, micro_batch_size=8), "not divisible"),
        (dict(batch_size=32, micro_batch_size=8, num_workers=3), "not divisible"),
        (dict(batch_size=32, micro_batch_size=8, grad_accum=0), "grad_accum must be >= 1"),
        (dict(batch_size=32, micro_batch_size=8, grad_accum=2), "fix one of them"),
        (dict(preset="DiT-Q/7"), "unknown preset"),
        (dict(dataset="/nonexistent/latents"), "neither 'digits' nor an existing"),
        (dict(lr=0.0), "lr must be > 0"),
        (dict(num_workers=-1), "num_workers must be >= 0"),
        (dict(eval_every=5, report_every=5, checkpoint_every=7), "multiple of report_every"),
        (dict(gns_every=10, gns_bin_examples=3), "must be even"),
    ],
)
def test_impossible_configs_raise_one_clear_error(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        TrialConfig(**kwargs)


def test_unknown_key_and_bad_type():
    with pytest.raises(ConfigError, match="unknown config key"):
        TrialConfig.from_dict({"learning_rate": 1e-3})
    with pytest.raises(ConfigError, match="must be int"):
        TrialConfig.from_dict({"batch_size": "lots"})
    assert TrialConfig.from_dict({"batch_size": "64", "gns": "false"}).gns is False


def test_resources_checked_before_workers_start():
    with pytest.raises(ConfigError, match="GPU"):
        check_trial(TrialConfig(use_gpu=True, num_workers=2, batch_size=64), resources={"CPU": 8, "GPU": 0})
    with pytest.raises(ConfigError, match="CPUs"):
        check_trial(TrialConfig(num_workers=4, batch_size=128), resources={"CPU": 2})
    check_trial(TrialConfig(num_workers=2, batch_size=64), resources={"CPU": 2})


def test_image_size_not_divisible_by_patch(tmp_path):
    import numpy as np

    root = tmp_path / "latents"
    (root / "imagenet256_features").mkdir(parents=True)
    (root / "imagenet256_labels").mkdir()
    for i in range(4):
        np.save(root / "imagenet256_features" / f"{i}.npy", np.zeros((1, 4, 32, 32), np.float32))
        np.save(root / "imagenet256_labels" / f"{i}.npy", np.array([i], np.int64))
    check_trial(TrialConfig(dataset=str(root), eval_size=2, timestep_bins=2), resources={"CPU": 2})
    np.save(root / "imagenet256_features" / "3.npy", np.zeros((1, 4, 30, 30), np.float32))
    with pytest.raises(ConfigError, match=r"expected \(1, 4, 32, 32\)"):
        check_trial(TrialConfig(dataset=str(root), eval_size=2, timestep_bins=2), resources={"CPU": 2})
    (root / "imagenet256_labels" / "3.npy").unlink()
    with pytest.raises(ConfigError, match="must pair up"):
        check_trial(TrialConfig(dataset=str(root), eval_size=2, timestep_bins=2), resources={"CPU": 2})


def test_gns_window_is_in_steps_and_holds_two_per_bin_measurements():
    assert TrialConfig(gns_every=0).gns_steps == 100  # auto, per-bin GNS off
    assert TrialConfig(gns_every=300, max_steps=200).gns_steps == 100  # per-bin never measures in 200 steps
    assert TrialConfig(gns_every=300, max_steps=5000).gns_steps == 1200  # auto: 4 per-bin measurements
    assert TrialConfig(gns_every=5, max_steps=60).gns_steps == 100
    cfg = TrialConfig(gns_every=5, gns_window=20, max_steps=60)
    assert cfg.gns_steps == 20 and TrialConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
    assert TrialConfig(gns_every=300, max_steps=5000).to_dict()["gns_window"] == 1200  # the resolved value is logged
    with pytest.raises(ConfigError, match="gns_window >= 10"):
        TrialConfig(gns_every=5, gns_window=9, max_steps=60)
    with pytest.raises(ConfigError, match="gns_window must be >= 0"):
        TrialConfig(gns_window=-1)
    with pytest.raises(ConfigError, match="replaced by gns_window"):
        TrialConfig.from_dict({"gns_ema_beta": 0.95})
    assert TrialConfig.from_saved({"gns_ema_beta": 0.95, "lr": 0.01}).lr == 0.01  # old checkpoints still load
