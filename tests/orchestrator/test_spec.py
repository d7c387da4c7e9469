"""Sweep-spec validation: every bad input is one UserError line, exit code 2 through the CLI, nothing launched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.errors import UserError
from orchestrator.specs.sweep_spec import load_spec, parse_spec
from orchestrator.sweep import check_spec
from tests.orchestrator.conftest import quadratic_spec, write_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dit_spec(tmp_path, **sections) -> dict:
    spec = quadratic_spec(tmp_path, workload="dit", **sections)
    spec["fixed"] = {"preset": "tiny", "dataset": "digits", "eval_every": 5}
    spec["nuisance"] = {"search": "grid", "lr": [1e-3]}
    return {**spec, **sections}


def test_tiny_example_expands_to_its_trials(tmp_path, no_ray_address):
    spec = load_spec(os.path.join(ROOT, "examples", "tiny.yaml"), [f"storage={tmp_path / 's'}"])
    configs = check_spec(spec, {"CPU": 6.0, "GPU": 0.0})
    # 5 batch sizes x 4 lrs x 3 seeds, plus B=64 as 32x2 accumulation and 32x2 workers at lr 1e-2 and the first seed
    assert spec.num_trials() == len(configs) == 5 * 4 * 3 + 2
    b64 = {(c["micro_batch_size"], c["grad_accum"], c["num_workers"]) for c in configs if c["batch_size"] == 64}
    assert b64 == {(64, 1, 0), (32, 2, 0), (32, 1, 2)}
    assert {c["batch_size"] for c in configs} == {8, 16, 32, 64, 128}
    lrs = {b: sorted({c["lr"] for c in configs if c["batch_size"] == b}) for b in (8, 128)}
    assert lrs == {8: [2.5e-3, 5e-3, 1e-2, 2e-2], 128: [5e-3, 1e-2, 2e-2, 4e-2]}
    assert {(c["batch_size"], c["eval_every"], c["max_steps"]) for c in configs if c["seed"] == 0} == {
        (8, 5, 240), (16, 4, 170), (32, 3, 100), (64, 2, 80), (128, 2, 70)
    }  # fmt: skip
    assert spec.mlflow_uri == f"sqlite:///{tmp_path / 's' / 'mlflow.db'}"


def test_compact_split_derives_micro_batch(tmp_path):
    spec = parse_spec(quadratic_spec(tmp_path, scientific={"batch_sizes": [64], "splits": [{"grad_accum": 4}]}))
    (cfg,) = {(c["micro_batch_size"], c["grad_accum"]) for c in spec.trial_configs()}
    assert cfg == (16, 4)


BAD = [
    ("unknown top key", lambda t: quadratic_spec(t, bogus=1), "unknown key bogus"),
    (
        "unknown nested key",
        lambda t: quadratic_spec(t, stopping={"max_step": 3}),
        "unknown key stopping.max_step (did you mean 'max_steps'?)",
    ),
    (
        "unknown key, nothing close",
        lambda t: quadratic_spec(t, scientific={"batch_sizes": [16], "zzz": 1}),
        "unknown key scientific.zzz; valid keys",
    ),
    (
        "unknown split key",
        lambda t: quadratic_spec(t, scientific={"batch_sizes": [16], "splits": [{"workers": 2}]}),
        "splits[0].workers",
    ),
    (
        "not divisible",
        lambda t: quadratic_spec(
            t,
            scientific={
                "batch_sizes": [24],
                "splits": [{"grad_accum": 1, "num_workers": 0}],
                "per_batch_size": {24: [{"grad_accum": 5}]},
            },
        ),
        "not divisible",
    ),
    ("fixed owns scientific key", lambda t: quadratic_spec(t, fixed={"lr": 0.1}), "fixed.lr is set by nuisance.lr"),
    ("unknown trial key", lambda t: quadratic_spec(t, fixed={"dimm": 3}), "unknown quadratic config key"),
    ("optuna without range", lambda t: quadratic_spec(t, nuisance={"search": "optuna", "lr": [0.1]}), "nuisance.lr"),
    ("bad search", lambda t: quadratic_spec(t, nuisance={"search": "random", "lr": [0.1]}), "nuisance.search"),
    ("GPUs on a CPU cluster", lambda t: dit_spec(t, scientific={"batch_sizes": [16], "use_gpu": True}), "GPU"),
    (
        "missing dataset",
        lambda t: {**dit_spec(t), "fixed": {"preset": "tiny", "dataset": "/nonexistent/latents"}},
        "dataset",
    ),
    (
        "unreachable tracking URI",
        lambda t: quadratic_spec(t, tracking={"mlflow_uri": "http://127.0.0.1:9"}),
        "unreachable",
    ),
    ("unwritable storage", lambda t: quadratic_spec(t, storage="/proc/bcrit-sweep"), "not writable"),
]


@pytest.mark.parametrize("case,make,message", BAD, ids=[b[0] for b in BAD])
def test_bad_spec_exits_2_and_launches_nothing(tmp_path, capsys, monkeypatch, no_ray_address, case, make, message):
    import ray

    # "No Ray started" must hold even when an earlier test of this session left Ray running: every way to start
    # (or connect to) Ray is recorded, with Ray reported as not running so that ensure_ray would reach ray.init.
    started = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append(("ray.init", a, k)))
    spec = make(tmp_path)
    assert main(["sweep", write_spec(tmp_path, spec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bcrit sweep: error:") and message in err[0], err
    assert not started, started  # no Ray started for a bad spec
    assert not os.path.exists(os.path.join(str(spec.get("storage", "")), "tune"))


def test_set_override_and_resume_of_nothing(tmp_path, capsys, no_ray_address):
    path = write_spec(tmp_path, quadratic_spec(tmp_path))
    with pytest.raises(UserError, match="nuisance.lr"):
        load_spec(path, ["nuisance.lr={low: 1, high: 2}"])
    assert main(["sweep", path, "--resume"]) == 2
    assert "not a bcrit sweep directory" in capsys.readouterr().err
    assert main(["sweep", str(tmp_path), "--resume"]) == 2
    assert "not a bcrit sweep directory" in capsys.readouterr().err


def test_resume_with_a_changed_spec_is_refused(tmp_path, capsys, no_ray_address):
    from orchestrator.storage.layout import SPEC_FILE

    path = write_spec(tmp_path, quadratic_spec(tmp_path))
    spec = load_spec(path, [])
    os.makedirs(spec.sweep_dir, exist_ok=True)
    with open(os.path.join(spec.sweep_dir, SPEC_FILE), "w") as f:
        f.write(spec.to_yaml())  # as the sweep recorded it when it started
    changed = write_spec(tmp_path, {**quadratic_spec(tmp_path), "stopping": {"max_steps": 7}}, "changed.yaml")
    assert main(["sweep", changed, "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "differs from the spec" in err and "\n" not in err


def test_the_saved_spec_pins_the_defaults_that_decide_how_a_sweep_runs(tmp_path, monkeypatch, no_ray_address):
    """The saved spec carries ``stopping.behind`` and an adaptive goal's ``running``, ``hold``, ``min_seeds`` as this
    bcrit resolved them: a sweep restored from its directory after those defaults change keeps them. A spec saved
    before they were pinned (the YAML as given) reads the current defaults, and resuming it from the same YAML still
    finds the two equal."""
    import yaml

    from orchestrator.execution.sweep_state import restore_spec
    from orchestrator.specs import adaptive_spec, sweep_spec
    from orchestrator.storage.layout import SPEC_FILE

    path = str(Path(__file__).parents[2] / "examples" / "adaptive-tiny.yaml")
    sweep_dir = tmp_path / "s"
    spec = load_spec(path, [], sweep_dir=str(sweep_dir))
    sweep_dir.mkdir()
    (sweep_dir / SPEC_FILE).write_text(spec.to_yaml())
    saved = yaml.safe_load(spec.to_yaml())
    assert saved["stopping"]["behind"] is True
    assert {k: saved["nuisance"]["goal"][k] for k in ("running", "hold", "min_seeds")} == {
        "running": "wait", "hold": True, "min_seeds": 2}  # fmt: skip

    monkeypatch.setattr(sweep_spec, "STOP_BEHIND_DEFAULT", False)  # a later bcrit's defaults
    monkeypatch.setattr(adaptive_spec, "RUNNING_DEFAULT", "end")
    monkeypatch.setattr(adaptive_spec, "HOLD_DEFAULT", False)
    monkeypatch.setattr(adaptive_spec, "MIN_SEEDS_DEFAULT", 3)
    fresh = load_spec(path, [], sweep_dir=str(sweep_dir))
    assert (fresh.stop_behind, fresh.adaptive.end_running, fresh.adaptive.hold, fresh.adaptive.min_seeds) == (
        False, True, False, 3)  # fmt: skip
    kept = restore_spec(str(sweep_dir))
    assert (kept.stop_behind, kept.adaptive.end_running, kept.adaptive.hold, kept.adaptive.min_seeds) == (
        True, False, True, 2)  # fmt: skip
    assert kept.to_yaml() != fresh.to_yaml()  # a YAML resumed against it must agree with what it pinned

    with open(path) as f:  # saved by a bcrit that pinned nothing: the YAML as given
        given = {**yaml.safe_load(f), "storage": str(sweep_dir)}
    (sweep_dir / SPEC_FILE).write_text(yaml.safe_dump(given, sort_keys=False))
    old = restore_spec(str(sweep_dir))
    assert (old.stop_behind, old.adaptive.end_running) == (False, True)  # the current defaults, as before
    assert old.to_yaml() == fresh.to_yaml()


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (Path(__file__).parents[2] / "examples").glob("*.yaml") if p.name != "trial.yaml")
)
def test_every_example_spec_loads(name, tmp_path):
    """Every shipped sweep or branched-study spec parses and validates (trial.yaml is a `bcrit train` config)."""
    import yaml

    from orchestrator.specs.branch_spec import load_branch_spec
    from orchestrator.specs.sweep_spec import load_spec

    path = str(Path(__file__).parents[2] / "examples" / name)
    with open(path) as f:
        kind = yaml.safe_load(f).get("kind")
    spec = load_branch_spec(path, []) if kind == "branched" else load_spec(path, [], sweep_dir=str(tmp_path / "s"))
    assert spec.name


def test_split_lr_subset_runs_that_split_at_those_grid_points_only(tmp_path):
    sci = {
        "batch_sizes": [32, 64],
        "per_batch_size": {64: [{"grad_accum": 1}, {"grad_accum": 2, "lr": 2e-3}, {"num_workers": 2, "lr": [1e-3]}]},
    }
    spec = parse_spec(dit_spec(tmp_path, scientific=sci, nuisance={"search": "grid", "lr": [1e-3, 2e-3, 4e-3]}))
    got = sorted((c["batch_size"], c["grad_accum"], c["num_workers"], c["lr"]) for c in spec.trial_configs())
    assert got == sorted(
        [(32, 1, 0, lr) for lr in (1e-3, 2e-3, 4e-3)] + [(64, 1, 0, lr) for lr in (1e-3, 2e-3, 4e-3)]
        + [(64, 2, 0, 2e-3), (64, 1, 2, 1e-3)]
    )  # fmt: skip
    assert spec.num_trials() == len(got) == 8
    assert all("lr" not in s.config() for ss in spec.splits.values() for s in ss)


@pytest.mark.parametrize(
    ("split_lr", "nuisance", "message"),
    [
        (
            5e-3,
            {"search": "grid", "lr": [1e-3, 2e-3]},
            "the lr of split 32x2x1 at batch size 64: 0.005 is not in nuisance.lr",
        ),
        ("fast", {"search": "grid", "lr": [1e-3]}, "must be a learning rate of nuisance.lr or a list of them"),
        (1e-3, {"search": "optuna", "lr": {"low": 1e-4, "high": 1e-2}}, "a split's lr subset needs search: grid"),
    ],
)
def test_split_lr_subset_bad_input(tmp_path, split_lr, nuisance, message):
    sci = {"batch_sizes": [64], "per_batch_size": {64: [{"grad_accum": 1}, {"grad_accum": 2, "lr": split_lr}]}}
    with pytest.raises(UserError, match=message):
        parse_spec(dit_spec(tmp_path, scientific=sci, nuisance=nuisance))


def test_split_num_seeds_runs_that_split_at_the_first_seeds_only(tmp_path):
    sci = {
        "batch_sizes": [32, 64],
        "per_batch_size": {
            64: [{"grad_accum": 1}, {"grad_accum": 2, "num_seeds": 1}, {"num_workers": 2, "num_seeds": 2}]
        },
    }
    raw = dit_spec(tmp_path, scientific=sci)
    raw["fixed"] = {**raw["fixed"], "seeds": [7, 3, 5]}
    spec = parse_spec(raw)
    got = sorted((c["batch_size"], c["grad_accum"], c["num_workers"], c["seed"]) for c in spec.trial_configs())
    assert got == sorted(
        [(32, 1, 0, s) for s in (7, 3, 5)] + [(64, 1, 0, s) for s in (7, 3, 5)]
        + [(64, 2, 0, 7), (64, 1, 2, 7), (64, 1, 2, 3)]
    )  # fmt: skip
    assert spec.num_trials() == len(got) == 9
    assert all("num_seeds" not in s.config() for ss in spec.splits.values() for s in ss)


@pytest.mark.parametrize(
    ("num_seeds", "message"),
    [
        (4, "num_seeds 4 of split 32x2x1 at batch size 64 exceeds the 3 seed\\(s\\) of fixed.seeds"),
        (0, "scientific.per_batch_size.64\\[1\\].num_seeds must be an integer >= 1, got 0"),
        ("one", "num_seeds must be an integer >= 1, got 'one'"),
    ],
)
def test_split_num_seeds_bad_input(tmp_path, num_seeds, message):
    sci = {"batch_sizes": [64], "per_batch_size": {64: [{"grad_accum": 1}, {"grad_accum": 2, "num_seeds": num_seeds}]}}
    raw = dit_spec(tmp_path, scientific=sci)
    raw["fixed"] = {**raw["fixed"], "seeds": [0, 1, 2]}
    with pytest.raises(UserError, match=message):
        parse_spec(raw)


def test_per_batch_size_eval_every_and_max_steps(tmp_path):
    spec = dit_spec(tmp_path, scientific={"batch_sizes": [16, 64], "splits": [{"grad_accum": 1}]})
    spec["fixed"] = {**spec["fixed"], "eval_every": {16: 4, "64": 1}}
    spec["stopping"] = {"max_steps": {16: 100, 64: 30}}
    got = {(c["batch_size"], c["eval_every"], c["max_steps"]) for c in parse_spec(spec).trial_configs()}
    assert got == {(16, 4, 100), (64, 1, 30)}
    spec["fixed"]["eval_every"] = {16: 4}
    with pytest.raises(UserError, match="fixed.eval_every has no value for batch size 64"):
        parse_spec(spec)
    spec["fixed"]["eval_every"] = {16: 4, 64: 1, 32: 2}
    with pytest.raises(UserError, match=r"fixed.eval_every.32 is not in scientific.batch_sizes \[16, 64\]"):
        parse_spec(spec)


def test_timestep_sampling_is_a_scientific_variable(tmp_path, no_ray_address):
    sci = {"batch_sizes": [16, 64], "splits": [{"grad_accum": 1, "num_workers": 0}]}
    base = quadratic_spec(tmp_path, fixed={"dim": 50, "eval_every": 1, "seeds": [0], "timestep_bins": 4})
    spec = parse_spec({**base, "scientific": {**sci, "timestep_sampling": ["uniform", "noise"]}})
    configs = spec.trial_configs()
    assert spec.num_trials() == len(configs) == 2 * 2 * 2  # batch sizes x lrs x samplers
    assert sorted({c["timestep_sampling"] for c in configs}) == ["noise", "uniform"]
    assert "timestep_sampling" not in parse_spec(base).trial_configs()[0]  # absent: today's configs
    from orchestrator.records.runs_tables import trial_row

    assert (
        trial_row("t", {**configs[-1], "lr": 0.5}, "running")["timestep_sampling"] == configs[-1]["timestep_sampling"]
    )
    for bad, message in [
        (["uniform", "snr"], "timestep_sampling must be a list"),
        (["noise", "noise"], "timestep_sampling must be a list"),
    ]:
        with pytest.raises(UserError, match=message):
            parse_spec({**base, "scientific": {**sci, "timestep_sampling": bad}})
    both = {**base, "fixed": {**base["fixed"], "timestep_sampling": "noise"}}
    with pytest.raises(UserError, match="keep one of them"):
        parse_spec({**both, "scientific": {**sci, "timestep_sampling": ["uniform"]}})
    with pytest.raises(UserError, match="search: grid"):
        parse_spec(
            {
                **base,
                "scientific": {**sci, "timestep_sampling": ["uniform"]},
                "nuisance": {"search": "optuna", "lr": {"low": 0.1, "high": 1.0}, "trials_per_batch_size": 2},
            }
        )


def test_stopping_behind_is_on_by_default_a_sweep_key_and_checked(tmp_path, no_ray_address):
    """stopping.behind (analysis.features.stop_behind.stop_behind): on unless set false; the sweep's, not its trials'
    config."""
    from orchestrator.execution.tuner import callbacks

    spec = parse_spec(quadratic_spec(tmp_path), sweep_dir=str(tmp_path / "s"))
    assert spec.stop_behind and spec.stops_behind == (spec.stopping.get("target_loss") is not None)
    assert all("behind" not in c for c in check_spec(spec, {"CPU": 2.0, "GPU": 0.0}))
    raw = quadratic_spec(tmp_path)
    off = parse_spec({**raw, "stopping": {**raw.get("stopping", {}), "behind": False}}, sweep_dir=str(tmp_path / "o"))
    assert not off.stop_behind and not off.stops_behind
    assert not any(type(cb).__name__ == "StopBehind" for cb in callbacks(off))
    with pytest.raises(UserError, match="stopping.behind must be true or false"):
        parse_spec({**raw, "stopping": {**raw.get("stopping", {}), "behind": "yes"}}, sweep_dir=str(tmp_path / "b"))
