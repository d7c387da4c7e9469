"""The workload registry (trainables.workloads): every workload is named in one place, an unknown one is refused in
one line before any compute, nothing falls back to the DiT, and a workload of your own in one file
(tests/orchestrator/toy_workload.py) runs through `bcrit sweep` on a local Ray."""

from __future__ import annotations

import dataclasses
import math

import pyarrow.parquet as pq
import pytest
import yaml

from analysis.core import metrics as M
from orchestrator.cli.main import main
from orchestrator.errors import UserError
from orchestrator.specs.branch_spec import parse_branch_spec
from orchestrator.specs.sweep_spec import parse_spec
from tests.orchestrator.conftest import quadratic_spec
from trainables import workloads
from trainables.config import BaseConfig, ConfigError

TOY = "tests.orchestrator.toy_workload:WORKLOAD"


@pytest.mark.parametrize("name", sorted(workloads.BUILTIN))
def test_every_builtin_resolves_to_itself(name):
    w = workloads.get_workload(name)
    assert w.name == name and issubclass(w.config_cls, BaseConfig)
    assert w.lr_rule == w.config_cls().schedule_lr_rule  # the branched study's default follows the config's


@pytest.mark.parametrize("bad", ["dits", "DiT", "", "x:", ":y", "a b:c", 5, None, [], {"a": 1}])
def test_an_unknown_workload_is_one_line_naming_the_known_ones(tmp_path, bad):
    with pytest.raises(UserError) as e:
        parse_spec(quadratic_spec(tmp_path, workload=bad))
    msg = str(e.value)
    assert "\n" not in msg and all(repr(k) in msg for k in workloads.BUILTIN) and "module:attr" in msg
    with pytest.raises(ConfigError):  # the trainable resolves with the same function: no silent DiT
        workloads.get_workload(bad)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("tests.orchestrator.no_such_module:WORKLOAD", "cannot be imported"),
        ("tests.orchestrator.toy_workload:NOPE", "cannot be imported"),
        ("tests.orchestrator.toy_workload:ToyConfig", "not a trainables.workloads.Workload"),
    ],
)
def test_an_import_path_that_is_no_workload_is_refused_at_spec_time(tmp_path, name, says):
    with pytest.raises(UserError, match=says) as e:
        parse_spec(quadratic_spec(tmp_path, workload=name))
    assert "\n" not in str(e.value)


def test_the_toy_is_checked_by_its_own_config(tmp_path):
    spec = parse_spec(quadratic_spec(tmp_path, workload=TOY, fixed={"mu": 1.0, "seeds": [0]}))
    assert spec.workload == TOY
    w = workloads.get_workload(TOY)
    cfg = w.config_cls.from_dict(spec.trial_configs()[0])
    assert (cfg.mu, cfg.lr) == (1.0, 0.5) and cfg.to_dict()["grad_accum"] == 1
    with pytest.raises(ConfigError, match="unknown toy config key"):
        w.config_cls.from_dict({"dim": 3})  # the quadratic's key is not the toy's


def test_a_branched_study_takes_its_rules_from_the_registry(tmp_path):
    """No name comparisons: the NQM's noise key set to B0, the DiT's branches without warm-up, the lr rule of the
    workload's config, and a workload with neither (the toy) gets neither."""
    spec = {
        "kind": "branched",
        "name": "b",
        "reference": {"batch_size": 4, "lr": 0.1},
        "branches": {"points": [10], "multipliers": [2], "examples": 64, "evals": 2},
        "fixed": {"eval_every": 5},
        "storage": str(tmp_path / "b"),
    }
    q = parse_branch_spec({**spec, "workload": "quadratic"})
    assert q.reference_config()["noise_unit"] == 4 and q.lr_rule == "linear"
    assert "warmup_steps" not in q.branch_config(10, 2.0, 0, "r")
    d = parse_branch_spec({**spec, "workload": "dit", "fixed": {"eval_every": 5, "warmup_steps": 3}})
    assert d.lr_rule == "sqrt" and d.branch_config(10, 2.0, 0, "r")["warmup_steps"] == 0
    assert d.reference_config()["warmup_steps"] == 3 and "noise_unit" not in d.reference_config()
    t = parse_branch_spec({**spec, "workload": TOY})
    fields = {f.name for f in dataclasses.fields(workloads.get_workload(TOY).config_cls)}
    assert t.lr_rule == "linear" and set(t.branch_config(10, 2.0, 0, "r")) - {"extra"} <= fields
    with pytest.raises(UserError, match="fixed.noise_unit is set by the branched study"):
        parse_branch_spec({**spec, "workload": "quadratic", "fixed": {"eval_every": 5, "noise_unit": 2}})


@pytest.mark.ray
def test_a_workload_in_one_file_runs_through_bcrit_sweep(tmp_path, ray_local, no_ray_address, capsys):
    """`bcrit sweep` on the toy: the trials run in Ray worker processes (which import the toy module by its
    path) and their first evaluation is the toy's own, ½ mu² (theta starts at 0)."""
    mu, target = 1.5, 0.02
    spec = quadratic_spec(
        tmp_path,
        workload=TOY,
        fixed={"mu": mu, "eval_every": 1, "report_every": 5, "seeds": [0]},
        nuisance={"search": "grid", "lr": [0.3]},
        stopping={"target_loss": target, "max_steps": 30},
    )
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(path)]) == 0, capsys.readouterr().err
    assert f"workload {TOY}" in capsys.readouterr().out
    sweep = tmp_path / "sweep"
    trials = pq.read_table(sweep / "trials.parquet").to_pylist()
    assert sorted(t["batch_size"] for t in trials) == [16, 64]
    assert all(t["status"] == M.STATUS_REACHED_TARGET for t in trials), trials
    rows = pq.read_table(sweep / "metrics.parquet").to_pylist()
    first = [r["value"] for r in rows if r["metric"] == M.EVAL_LOSS and r["step"] == 0]
    assert len(first) == 2 and all(math.isclose(v, 0.5 * mu**2) for v in first)
    last = {t["trial_id"]: max(r["step"] for r in rows if r["trial_id"] == t["trial_id"]) for t in trials}
    for t in trials:
        final = [r["value"] for r in rows if r["trial_id"] == t["trial_id"] and r["metric"] == M.EVAL_LOSS]
        assert final[-1] <= target and last[t["trial_id"]] == t["step"]
