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
        (dict(batch_size=32, micro_batch_size=8, grad_accum=0), r"grad_accum must be an integer in \[1, "),
        (dict(batch_size=32, micro_batch_size=8, grad_accum=2), "fix one of them"),
        (dict(preset="DiT-Q/7"), "unknown preset"),
        (dict(dataset="/nonexistent/latents"), "neither 'digits' nor an existing"),
        (dict(lr=0.0), "lr must be a number > 0"),
        (dict(num_workers=-1), r"num_workers must be an integer in \[0, 4096\]"),
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
    every = dict(gns_global_every=1)  # global GNS at every step (the sparse cadence's 8 x k: test_gns_cadence.py)
    assert TrialConfig(gns_every=0, **every).gns_steps == 100  # auto, per-bin GNS off
    assert TrialConfig(gns_every=300, max_steps=200, **every).gns_steps == 100  # per-bin never measures in 200 steps
    assert TrialConfig(gns_every=300, max_steps=5000).gns_steps == 1200  # auto: 4 per-bin measurements
    assert TrialConfig(gns_every=5, max_steps=60, **every).gns_steps == 100
    assert TrialConfig(gns_every=5, max_steps=60).gns_steps == 320  # 8 measurements of the auto halves cadence 40
    cfg = TrialConfig(gns_every=5, gns_window=20, max_steps=60)
    assert cfg.gns_steps == 20 and TrialConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
    assert TrialConfig(gns_every=300, max_steps=5000).to_dict()["gns_window"] == 1200  # the resolved value is logged
    with pytest.raises(ConfigError, match="gns_window >= 10"):
        TrialConfig(gns_every=5, gns_window=9, max_steps=60)
    with pytest.raises(ConfigError, match=r"gns_window must be an integer in \[0, "):
        TrialConfig(gns_window=-1)
    with pytest.raises(ConfigError, match="replaced by gns_window"):
        TrialConfig.from_dict({"gns_ema_beta": 0.95})
    assert TrialConfig.from_saved({"gns_ema_beta": 0.95, "lr": 0.01}).lr == 0.01  # old checkpoints still load


# --- the bounds table (trainables.config.BOUNDS), field by field ------------------------------------------------
from dataclasses import fields  # noqa: E402

from pydantic import TypeAdapter  # noqa: E402

from trainables.config import BOUNDS, Bound  # noqa: E402
from trainables.nqm_trial import QuadraticConfig  # noqa: E402


def bad_values(b: Bound) -> list:
    """Values the row must refuse: the wrong types, non-finite numbers, and one step past each end."""
    out: list = {"dict": [[1], "x", 3], "list": [{"a": 1}, "x", 3, [-1], [1.5], ["a"]]}.get(b.kind, [[1], {"a": 1}])
    if b.kind in ("int", "float"):
        out += ["abc", True, float("nan"), float("inf")]
        step = 1 if b.kind == "int" else 1e-9
        if b.lo is not None:
            out.append(b.lo if b.lo_open else b.lo - step)
        if b.hi is not None:
            out.append(b.hi if b.hi_open else b.hi + step)
        if b.kind == "int":
            out.append(1.5)
    elif b.kind == "bool":
        out += ["maybe", 2, 0.5]
    elif b.kind == "str":
        out += [5, ""]
    if not b.optional and b.kind != "dict":
        out.append(None)
    return out


def good_values(b: Bound) -> list:
    """Values at the closed ends of the row (the open ends just inside)."""
    if b.kind == "int":
        return [b.lo + (1 if b.lo_open else 0)] + ([] if b.hi is None else [b.hi - (1 if b.hi_open else 0)])
    if b.kind == "float":
        lo = 0.0 if b.lo is None else b.lo + (1e-6 if b.lo_open else 0.0)
        return [lo] + ([] if b.hi is None else [b.hi - (1e-6 if b.hi_open else 0.0)])
    return []


def test_bounds_table_covers_every_field():
    assert {f.name for f in fields(TrialConfig)} == set(BOUNDS)
    assert {f.name for f in fields(QuadraticConfig)} == set(QuadraticConfig.BOUNDS)


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_each_trial_field_refuses_out_of_range_and_wrong_type(name):
    b = BOUNDS[name]
    for v in bad_values(b):
        with pytest.raises(ConfigError, match=name) as e:
            TrialConfig.from_dict({name: v})
        assert "\n" not in str(e.value), (name, v)
    for v in good_values(b):
        TypeAdapter(b.type).validate_python(v)  # the field's type takes it (raises otherwise)


@pytest.mark.parametrize("name", sorted(QuadraticConfig.BOUNDS))
def test_each_quadratic_field_refuses_out_of_range_and_wrong_type(name):
    for v in bad_values(QuadraticConfig.BOUNDS[name]):
        with pytest.raises(ConfigError, match=name):
            QuadraticConfig.from_dict({name: v})


@pytest.mark.parametrize(
    "key, value",
    [("beta2", 1.5), ("weight_decay", -1), ("threads_per_worker", -3), ("warmup_steps", -10), ("seed", -1)],
)
def test_issue_14_values_torch_would_reject_deep_inside(key, value):
    with pytest.raises(ConfigError, match=f"{key} must be"):
        TrialConfig.from_dict({key: value})


def test_numbers_as_yaml_strings_still_coerce():
    c = TrialConfig.from_dict({"lr": "1e-3", "max_steps": "20", "seed": "3", "target_loss": "0.5"})
    assert (c.lr, c.max_steps, c.seed, c.target_loss) == (1e-3, 20, 3, 0.5)
    with pytest.raises(ConfigError, match="must be int"):
        TrialConfig.from_dict({"max_steps": "2.5"})


# --- the pydantic model: number forms, the rules across fields, what users of the class rely on -----------------
def test_number_strings_in_every_form():
    c = TrialConfig.from_dict({"lr": "3E-4", "max_steps": "1e5", "eval_every": "2.0", "beta2": "9.5e-1"})
    assert (c.lr, c.max_steps, c.eval_every, c.beta2) == (3e-4, 100000, 2, 0.95)
    assert type(c.max_steps) is int and type(TrialConfig.from_dict({"lr": 1}).lr) is float
    for key, value in [("max_steps", True), ("lr", False), ("lr", "inf"), ("max_steps", "1e400"), ("seed", "1e-3")]:
        with pytest.raises(ConfigError, match=key):
            TrialConfig.from_dict({key: value})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=48, micro_batch_size=16, num_workers=2), "not divisible by micro_batch_size x workers = 32"),
        (dict(batch_size=16, micro_batch_size=8, batch_schedule=[[4, 20]]), "multiple of micro_batch_size"),
        (dict(timestep_sampling="noise", gns_every=0), "set gns_every to a step count"),
        (dict(batch_size=8, micro_batch_size=8, gns_global_every=300, max_steps=200), "never measure"),
        (dict(use_gpu=True, num_workers=2, batch_size=64, gpus_per_worker=0.5), "NCCL refuses"),
        (dict(gns_every=5, gns_bin_examples=1), "gns_bin_examples >= 2"),
        (dict(eval_size=4, timestep_bins=5), "eval_size 4 must be >= timestep_bins 5"),
    ],
)
def test_each_rule_across_fields_is_one_line(kwargs, match):
    with pytest.raises(ConfigError, match=match) as e:
        TrialConfig.from_dict(kwargs)
    assert "\n" not in str(e.value)


def test_unknown_key_names_the_closest_and_the_class_stays_a_frozen_dataclass():
    import dataclasses
    import pickle

    with pytest.raises(ConfigError, match=r"unknown config key\(s\) \['lrr'\] \(did you mean 'lr'\?\); valid keys"):
        TrialConfig.from_dict({"lrr": 0.1})
    c = TrialConfig(batch_schedule=[[4, 64]], extra={"tag": 1})
    assert pickle.loads(pickle.dumps(c)) == c and TrialConfig.from_dict(c.to_dict()).to_dict() == c.to_dict()
    assert dataclasses.replace(c, seed=2).seed == 2 and dataclasses.fields(c)[0].name == "batch_size"
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.lr = 1.0  # type: ignore[misc]
    with pytest.raises(ConfigError, match="lr must be a number > 0"):
        dataclasses.replace(c, lr=0)


def test_a_workload_config_needs_bounded_types_and_config_class():
    import dataclasses

    from trainables.config import BaseConfig, config_class

    with pytest.raises(TypeError, match=r"fields \['mu'\] need a bounded type"):

        @config_class
        class Unbounded(BaseConfig):
            mu: float = 1.0

    @dataclasses.dataclass(frozen=True)
    class Plain(BaseConfig):
        pass

    with pytest.raises(TypeError, match="config_class"):
        Plain()
