"""Numbers as users write them: ``1e-3``, ``3E-4``, ``1e5``, ``-2.5e-4`` and ``.5`` are floats (YAML 1.2's core
schema; PyYAML's YAML 1.1 rules read a float without a dot as a string) in spec files and in ``--set``, for the sweep
spec (grid lists and optuna ranges), the adaptive spec, the branched spec and the trial config."""

from __future__ import annotations

import os
import shlex

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.specs.branch_spec import load_branch_spec
from orchestrator.specs.sweep_spec import load_spec
from orchestrator.specs.yaml_overrides import apply_overrides, dump_yaml, load_yaml, parse_yaml
from tests.orchestrator.conftest import quadratic_spec
from tests.orchestrator.test_adaptive_spec import adaptive_spec
from tests.orchestrator.test_branch_quadratic import quadratic_branch_spec
from trainables.config import TrialConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NUMBERS = [  # (as written, as read)
    ("1e-3", 1e-3),
    ("3E-4", 3e-4),
    ("1e5", 1e5),
    ("-2.5e-4", -2.5e-4),
    ("+1e-2", 1e-2),
    (".5", 0.5),
    ("5.", 5.0),
    ("1.0e-3", 1e-3),
    ("2.0E+2", 200.0),
    ("42", 42),
    ("-7", -7),
    ("010", 10),  # decimal (YAML 1.1 read eight)
    ("0o17", 15),
    ("0x1F", 31),
    (".inf", float("inf")),
]
STRINGS = ["1_000", "1_000.5", "0b101", "1:30", "1e", "e5", "abc", "1e-3x"]  # YAML 1.2 core: not numbers


@pytest.mark.parametrize("text, value", NUMBERS)
def test_number_forms_in_a_file_and_in_set(text, value):
    for got in (parse_yaml(f"x: {text}\ny: [{text}]\n", "t.yaml"), apply_overrides({}, [f"x={text}", f"y=[{text}]"])):
        assert got["x"] == value and type(got["x"]) is type(value), (text, got)
        assert got["y"] == [value] and type(got["y"][0]) is type(value), (text, got)


@pytest.mark.parametrize("text", STRINGS)
def test_not_numbers_stay_strings(text):
    assert parse_yaml(f"x: {text}\n", "t.yaml") == {"x": text}
    assert apply_overrides({}, [f"x={text}"]) == {"x": text}


def test_booleans_and_null_unchanged():
    got = parse_yaml("a: true\nb: no\nc: null\nd: ~\ne: False\n", "t.yaml")
    assert got == {"a": True, "b": False, "c": None, "d": None, "e": False}


def test_saved_yaml_reads_back_the_same_with_bcrit_and_plain_pyyaml():
    data = {"s": ["1e-3", "0o17", "1_000", "010", ".5", "abc"], "f": [1e-5, 3e-4, 1e5, 0.5], "i": [10, -3], "b": True}
    text = dump_yaml(data)
    assert parse_yaml(text, "saved.yaml") == data == yaml.safe_load(text)


def _spec_file(tmp_path, nuisance_yaml: str, name: str = "spec.yaml") -> str:
    """A quadratic sweep spec whose ``nuisance`` section is written by hand (as a user types it)."""
    spec = quadratic_spec(tmp_path)
    del spec["nuisance"]
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec) + "nuisance:\n" + nuisance_yaml)
    return str(path)


def _lrs(spec) -> list[float]:
    return sorted({c["lr"] for c in spec.trial_configs()})


def test_sweep_grid_lr_list(tmp_path):
    path = _spec_file(tmp_path, "  search: grid\n  lr: [1e-4, 3E-4, .5]\n  weight_decay: 1e-2\n")
    spec = load_spec(path)
    assert _lrs(spec) == [1e-4, 3e-4, 0.5]
    assert {c["weight_decay"] for c in spec.trial_configs()} == {1e-2}
    assert _lrs(load_spec(path, ["nuisance.lr=[1e-3,3e-3]"])) == [1e-3, 3e-3]
    assert _lrs(load_spec(path, ["nuisance.lr=2e-1"])) == [0.2]


def test_sweep_optuna_lr_range(tmp_path):
    path = _spec_file(tmp_path, "  search: optuna\n  lr: {low: 1e-4, high: 1e-3}\n  trials_per_batch_size: 2\n")
    spec = load_spec(path)
    assert spec.nuisance["lr"] == (1e-4, 1e-3)
    assert load_spec(path, ["nuisance.lr={low: 2e-4, high: 5E-3}"]).nuisance["lr"] == (2e-4, 5e-3)
    assert load_spec(path, ["nuisance.lr.low=3e-4"]).nuisance["lr"] == (3e-4, 1e-3)


def test_documented_sweep_command_sets_its_lrs():
    """docs/sweeps.md's ``bcrit sweep SPEC --set ... --set nuisance.lr=[1e-3,3e-3]`` validates as written: the grid
    it sets is [0.001, 0.003] (its spec's splits name no lr of their own; examples/tiny.yaml's do, and must be in
    the grid)."""
    docs = open(os.path.join(ROOT, "docs", "sweeps.md"), encoding="utf-8").read()
    line = next(x for x in docs.splitlines() if "nuisance.lr=" in x)
    argv = shlex.split(line.split("#")[0])
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert "nuisance.lr=[1e-3,3e-3]" in sets
    assert apply_overrides({}, sets)["nuisance"]["lr"] == [0.001, 0.003]
    assert argv[1] == "sweep"
    spec = load_spec(os.path.join(ROOT, argv[2]), sets, sweep_dir="/tmp/bcrit-unused")
    assert _lrs(spec) == [0.001, 0.003]
    assert {c["max_steps"] for c in spec.trial_configs()} == {80}


def test_adaptive_spec_numbers(tmp_path):
    spec = adaptive_spec(tmp_path)
    del spec["nuisance"]
    nui = "  search: adaptive\n  lr: [5e-1, 1e0, 1.5]\n  goal: {rel_ci: 2e-1, targets: auto}\n"
    nui += "  budget: {examples: 1e5}\n"
    path = tmp_path / "adaptive.yaml"
    path.write_text(yaml.safe_dump(spec) + "nuisance:\n" + nui)
    got = load_spec(str(path))
    assert _lrs(got) == [0.5, 1.0, 1.5]
    assert got.adaptive.rel_ci == 0.2 and got.adaptive.budget_examples == 1e5
    got = load_spec(str(path), ["nuisance.goal.rel_ci=1e-1", "nuisance.budget.examples=2E5", "nuisance.lr=[5e-1,1e0]"])
    assert got.adaptive.rel_ci == 0.1 and got.adaptive.budget_examples == 2e5 and _lrs(got) == [0.5, 1.0]


def test_branched_spec_numbers(tmp_path):
    spec = quadratic_branch_spec(tmp_path)
    spec["reference"] = "REF"
    path = tmp_path / "branched.yaml"
    path.write_text(yaml.safe_dump(spec).replace("REF", "{batch_size: 8, lr: 1e-1, seed: 0}"))
    got = load_branch_spec(str(path))
    assert got.reference_config()["lr"] == 0.1
    assert load_branch_spec(str(path), ["reference.lr=5e-2"]).reference_config()["lr"] == 0.05


def test_trial_config_numbers(tmp_path):
    path = tmp_path / "trial.yaml"
    path.write_text("preset: tiny\nlr: 1e-3\nadam_eps: 1E-8\nweight_decay: .5\nmax_steps: 5\n")
    data = load_yaml(str(path))
    assert (data["lr"], data["adam_eps"], data["weight_decay"]) == (1e-3, 1e-8, 0.5)
    cfg = TrialConfig.from_dict(apply_overrides(data, ["lr=3e-4", "beta2=9.5e-1"]))
    assert (cfg.lr, cfg.beta2, cfg.adam_eps, cfg.max_steps) == (3e-4, 0.95, 1e-8, 5)


def test_train_set_lr(tmp_path, monkeypatch, capsys):
    """``bcrit train --set lr=3e-4`` reaches the trial with lr 0.0003; ``--set lr=abc`` is one line, exit 2."""
    from orchestrator.cli import train_cmd
    from orchestrator.errors import UserError

    ran = []

    def fake_run(cfg, *a, **k):
        ran.append(cfg)
        raise UserError("stopped before training (test)")

    monkeypatch.setattr(train_cmd, "_cluster_resources", lambda args: None)
    monkeypatch.setattr(train_cmd, "_run_with_progress", fake_run)
    path = tmp_path / "trial.yaml"
    path.write_text("preset: tiny\ndataset: digits\nbatch_size: 8\nmicro_batch_size: 8\nmax_steps: 5\n")
    argv = ["train", str(path), "--storage", str(tmp_path / "runs"), "--name", "t"]
    assert main([*argv, "--set", "lr=3e-4"]) == 2
    assert [c.lr for c in ran] == [3e-4]
    capsys.readouterr()
    assert main([*argv, "--set", "lr=abc"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "bcrit train: error: config key 'lr' must be float, got 'abc'" and len(ran) == 1
