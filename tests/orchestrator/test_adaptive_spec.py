"""``nuisance.search: adaptive``: its goal and budget parsed, every bad value one UserError line (exit 2 through
the CLI, before Ray starts)."""

from __future__ import annotations

import os

import pytest

from orchestrator.cli.main import main
from orchestrator.errors import UserError
from orchestrator.specs.sweep_spec import parse_spec
from tests.orchestrator.conftest import quadratic_spec, write_spec


def adaptive_spec(tmp_path, **nuisance) -> dict:
    nui = {"search": "adaptive", "lr": [0.5, 1.0, 1.5], "goal": {"rel_ci": 0.2, "targets": "auto"},
           "budget": {"trials": 12}, **nuisance}  # fmt: skip
    spec = quadratic_spec(tmp_path, nuisance=nui)
    spec["scientific"]["batch_sizes"] = [16, 64, 256]
    spec["fixed"]["seeds"] = [0, 1]
    return spec


def test_goal_and_budget_parsed(tmp_path):
    spec = parse_spec(adaptive_spec(tmp_path))
    assert spec.search == "adaptive"
    assert spec.adaptive.rel_ci == 0.2 and spec.adaptive.min_seeds == 2
    assert spec.adaptive.targets == (0.5,)  # auto: the stopping target
    assert spec.adaptive.budget_trials == 12 and spec.adaptive.budget_examples is None
    assert len(spec.trial_configs()) == 3 * 3 * 2  # the space: batch sizes x lr grid x seeds
    assert spec.num_trials() == 12  # at most the trial budget
    spec = parse_spec(adaptive_spec(tmp_path, goal={"rel_ci": 0.1, "targets": [0.6, 0.8]}, budget={"examples": 1e5}))
    assert spec.adaptive.targets == (0.6, 0.8) and spec.adaptive.budget_examples == 1e5
    assert spec.num_trials() == 18
    assert not spec.adaptive.end_running  # goal.running: wait, the default
    assert parse_spec(adaptive_spec(tmp_path, goal={"rel_ci": 0.1, "running": "end"})).adaptive.end_running
    assert spec.adaptive.hold  # goal.hold: true, the default
    assert not parse_spec(adaptive_spec(tmp_path, goal={"rel_ci": 0.1, "hold": False})).adaptive.hold


@pytest.mark.parametrize(
    "change, message",
    [
        ({"goal": {"rel_ci": 1.5}}, "nuisance.goal.rel_ci must be a number in (0, 1)"),
        ({"goal": {"rel_ci": 0.2, "bins": "yes"}}, "nuisance.goal.bins must be true or false"),
        ({"goal": {"rel_ci": 0.2, "targets": [0.1]}}, "below stopping.target_loss"),
        ({"goal": {"rel_ci": 0.2, "targets": "all"}}, "must be 'auto' or a non-empty list"),
        ({"goal": {"rel_ci": 0.2, "min_seeds": 3}}, "exceeds the 2 seed(s) of fixed.seeds"),
        ({"goal": {"rel_ci": 0.2, "width": 1}}, "unknown key nuisance.goal.width"),
        ({"goal": {"rel_ci": 0.2, "running": "stop"}}, "nuisance.goal.running must be wait or end"),
        ({"goal": {"rel_ci": 0.2, "hold": "yes"}}, "nuisance.goal.hold must be true or false"),
        ({"goal": None}, "needs nuisance.goal"),
        ({"budget": {}}, "needs nuisance.budget"),
        ({"budget": {"trials": 0}}, "nuisance.budget.trials must be an integer >= 1"),
        ({"budget": {"examples": "2.0e6"}}, "nuisance.budget.examples must be a number > 0"),
        ({"budget": {"hours": 2}}, "unknown key nuisance.budget.hours"),
        ({"beta2": [0.9, 0.99]}, "searches lr only"),
        ({"trials_per_batch_size": 4}, "trials_per_batch_size is for search: optuna"),
    ],
)
def test_bad_adaptive_spec_is_one_line(tmp_path, change, message):
    with pytest.raises(UserError) as e:
        parse_spec(adaptive_spec(tmp_path, **change))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_goal_without_adaptive_refused(tmp_path):
    spec = quadratic_spec(tmp_path)
    spec["nuisance"]["goal"] = {"rel_ci": 0.2}
    with pytest.raises(UserError, match="for search: adaptive"):
        parse_spec(spec)


def test_too_few_batch_sizes_refused(tmp_path):
    spec = adaptive_spec(tmp_path)
    spec["scientific"]["batch_sizes"] = [16, 64]
    with pytest.raises(UserError, match=">= 3 scientific.batch_sizes"):
        parse_spec(spec)


def test_bad_adaptive_spec_exits_2_through_the_cli(tmp_path, capsys, no_ray_address):
    spec = adaptive_spec(tmp_path, goal={"rel_ci": 0})
    assert main(["sweep", write_spec(tmp_path, spec)]) == 2
    err = capsys.readouterr().err
    assert "nuisance.goal.rel_ci" in err and "Traceback" not in err
    assert not (tmp_path / "sweep").exists()


def test_resume_may_change_only_the_goal_and_budget(tmp_path):
    import argparse
    import os

    from orchestrator.execution.sweep_state import restore_spec
    from orchestrator.features.adaptive.adaptive_resume import resume_spec
    from orchestrator.specs.sweep_spec import load_spec
    from orchestrator.storage.layout import SPEC_FILE

    raw = adaptive_spec(tmp_path)
    path = write_spec(tmp_path, raw)
    spec = load_spec(path)
    os.makedirs(spec.sweep_dir)
    with open(os.path.join(spec.sweep_dir, SPEC_FILE), "w") as f:
        f.write(spec.to_yaml())

    def args(target, *sets):
        return argparse.Namespace(spec=target, set=list(sets), resume=True)

    new = resume_spec(args(spec.sweep_dir, "nuisance.goal.rel_ci=0.1"), load_spec, restore_spec)
    assert new.adaptive.rel_ci == 0.1 and new.sweep_dir == spec.sweep_dir
    new = resume_spec(args(path, "nuisance.budget.trials=20"), load_spec, restore_spec)  # the YAML form
    assert new.adaptive.budget_trials == 20
    assert resume_spec(args(spec.sweep_dir, "stopping.max_steps=5"), load_spec, restore_spec) is None
    assert resume_spec(args(path, "fixed.dim=10"), load_spec, restore_spec) is None  # the usual refusal then
    assert main(["sweep", spec.sweep_dir, "--resume", "--set", "nuisance.goal.rel_ci=2"]) == 2  # still validated
    from orchestrator.execution.run_sweep import open_spec  # the Python API's spec (orchestrator.sweep.sweep)

    assert open_spec(spec.sweep_dir, ["nuisance.goal.rel_ci=0.1"], resume=True).adaptive.rel_ci == 0.1
    assert open_spec(path, ["nuisance.budget.trials=20"], resume=True).adaptive.budget_trials == 20
    with pytest.raises(UserError, match="--set cannot change a sweep being resumed"):
        open_spec(spec.sweep_dir, ["stopping.max_steps=5"], resume=True)


def test_resume_gives_the_restored_searcher_the_specs_hold(tmp_path):
    """``bcrit sweep --resume`` restores the searcher Tune pickled; ``adaptive_resume.renew`` then sets what the spec
    says and the state does not hold. ``goal.hold`` among them: a searcher pickled before it existed has no ``_hold``
    (its first refit failed with AttributeError), and ``--set nuisance.goal.hold=false`` on resume must take."""
    from orchestrator.features.adaptive.adaptive_resume import renew
    from orchestrator.features.adaptive.adaptive_search import AdaptiveSearch

    old = AdaptiveSearch.from_spec(parse_spec(adaptive_spec(tmp_path)))
    del old._hold  # as pickled by the version before goal.hold
    spec = parse_spec(adaptive_spec(tmp_path, goal={"rel_ci": 0.2, "targets": "auto", "hold": False}))
    os.makedirs(spec.sweep_dir, exist_ok=True)
    renew(old, spec, str(tmp_path / "tune"))
    assert old._hold is False
    renew(old, parse_spec(adaptive_spec(tmp_path)), str(tmp_path / "tune"))
    assert old._hold is True


def test_resume_at_a_uri_names_goal_running_when_only_it_changed(tmp_path):
    """A sweep begun with ``goal.running: end`` and resumed at a URI with another ``running`` (its saved spec
    overridden, or a spec that leaves it at the default ``wait``): the one-line refusal says how to resume."""
    from orchestrator.features.adaptive.adaptive_resume import renew
    from orchestrator.features.adaptive.adaptive_search import AdaptiveSearch

    old = AdaptiveSearch.from_spec(parse_spec(adaptive_spec(tmp_path, goal={"rel_ci": 0.2, "running": "end"})))
    with pytest.raises(UserError, match=r"--set nuisance.goal.running=end\)$"):
        renew(old, parse_spec(adaptive_spec(tmp_path)), "s3://bucket/sweeps/tune")
    with pytest.raises(UserError, match=r"directory storage\)$"):  # another change: no hint
        renew(old, parse_spec(adaptive_spec(tmp_path, goal={"rel_ci": 0.3, "running": "end"})), "s3://b/t")
