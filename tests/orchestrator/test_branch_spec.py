"""Branched-study specs: the example parses, configs are what the study needs, mistakes are refused in one line."""

from __future__ import annotations

import os

import pytest

from orchestrator.cli.main import main
from orchestrator.errors import UserError
from orchestrator.specs.branch_spec import parse_branch_spec
from orchestrator.specs.yaml_overrides import load_yaml
from tests.orchestrator.test_branch_quadratic import quadratic_branch_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_examples_parse_and_configs():
    for name in ("branched-quadratic.yaml", "branched-tiny.yaml"):
        spec = parse_branch_spec(load_yaml(os.path.join(ROOT, "examples", name)), sweep_dir="/tmp/i11-unused")
        assert spec.multipliers[0] == 1.0
        ref = spec.reference_config()
        assert ref["max_steps"] == max(spec.points) and ref["keep_steps"] == list(spec.points)
        for p, k, s in spec.branches():
            cfg = spec.branch_config(p, k, s, "ref")
            assert cfg["batch_size"] * cfg["max_steps"] == spec.delta
            assert cfg["max_steps"] % cfg["eval_every"] == 0 and cfg["max_steps"] // cfg["eval_every"] == spec.evals
            assert cfg["extra"] == {"parent_trial_id": "ref", "branch_step": p, "k": k}
            assert cfg["init_from"].endswith(f"step{p:08d}")


def test_lr_rule_and_scale_by(tmp_path):
    spec = parse_branch_spec(quadratic_branch_spec(tmp_path, lr_rule="sqrt", scale_by="grad_accum"))
    cfg = spec.branch_config(100, 4.0, 0, "r")
    assert cfg["lr"] == pytest.approx(0.2) and (cfg["micro_batch_size"], cfg["grad_accum"]) == (8, 4)
    spec = parse_branch_spec(quadratic_branch_spec(tmp_path, scale_by="num_workers", multipliers=[2]))
    cfg = spec.branch_config(100, 2.0, 0, "r")
    assert (cfg["micro_batch_size"], cfg["grad_accum"], cfg["num_workers"]) == (8, 1, 2)
    dit = quadratic_branch_spec(tmp_path)
    dit.update(workload="dit", fixed={"preset": "tiny"})
    assert parse_branch_spec(dit).lr_rule == "linear"  # given explicitly
    del dit["branches"]["lr_rule"]
    assert parse_branch_spec(dit).lr_rule == "sqrt"  # Adam's default


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["branches"].update(examples=1000), "multiple of evals"),
        (lambda s: s["branches"].update(multipliers=[2.3]), "not an integer batch size"),
        (lambda s: s["branches"].update(multipliers=[3], scale_by="grad_accum", examples=4800), None),
        (lambda s: s["branches"].update(multipliers=[1.5], scale_by="grad_accum"), "integer"),
        (lambda s: s["branches"].update(lr_rule="cubic"), "lr_rule"),
        (lambda s: s["branches"].update(points=[]), "points"),
        (lambda s: s["branches"].update(points=[100, 100]), "duplicates"),
        (lambda s: s["analysis"].update(compare="worst"), "compare"),
        (lambda s: s["analysis"].update(window=1.0), "window"),
        (lambda s: s["analysis"].update(epsilons=[-0.1]), "epsilons"),
        (lambda s: s["fixed"].update(lr=0.5), "fixed.lr"),
        (lambda s: s["reference"].pop("batch_size"), "reference.batch_size"),
        (lambda s: s.update(kind="sweep"), "kind"),
        (lambda s: s.update(bogus=1), "unknown key bogus"),
        (lambda s: s["reference"].update(checkpoints="/nonexistent"), "no checkpoint"),
    ],
)
def test_bad_specs_refused(tmp_path, change, message):
    spec = quadratic_branch_spec(tmp_path)
    change(spec)
    if message is None:
        parse_branch_spec(spec)
        return
    with pytest.raises(UserError, match=message):
        parse_branch_spec(spec)


def test_cli_refuses_in_one_line(tmp_path, capsys):
    import yaml

    spec = quadratic_branch_spec(tmp_path)
    spec["branches"]["points"] = [110]  # not on the reference's eval cadence (50)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["branch", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "multiples of the reference's report cadence" in err[0]
    assert main(["sweep", str(path)]) == 2  # a sweep refuses a branched spec and says where it goes
    assert "bcrit branch" in capsys.readouterr().err


def test_a_branched_spec_builds_the_sweeps_trainable_and_callbacks(tmp_path):
    """A branched study runs its phases through the sweep's trainable and callbacks (orchestrator.execution.tuner): they
    read only what a BranchSpec has too (a sweep-only attribute broke `bcrit branch` once: storage_root, search)."""
    from orchestrator.execution.tuner import callbacks, sweep_trainable
    from orchestrator.specs.branch_spec import load_branch_spec

    spec = load_branch_spec(os.path.join(ROOT, "examples", "branched-quadratic.yaml"), [f"storage={tmp_path / 'b'}"])
    assert spec.storage_root == spec.sweep_dir and spec.storage_uri is None
    assert sweep_trainable(spec, 0) is not None
    names = [type(cb).__name__ for cb in callbacks(spec, total=3)]
    assert {"MLflowTracking", "TablesCallback", "SweepProgress"} <= set(names)
