"""Hostile but ordinary input (issue 14): every key of the trial config and of the sweep spec mutated to an
out-of-range or wrong-type value gives one line, exit code 2, no traceback, and launches nothing (no Ray, no
trainer, no Tune directory). `bcrit`'s main runs in-process; launching is replaced by a tripwire."""

from __future__ import annotations

import math
import os

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from orchestrator.cli.main import main
from orchestrator.specs.sweep_spec import OWNED
from tests.orchestrator.conftest import quadratic_spec
from trainables.config import BOUNDS, Bound, TrialConfig
from trainables.nqm_trial import QuadraticConfig

SETTINGS = settings(
    max_examples=int(os.environ.get("BCRIT_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    database=None,
)
TRIAL = {"preset": "tiny", "dataset": "digits", "batch_size": 32, "micro_batch_size": 16, "max_steps": 5}
JUNK = st.one_of(
    st.lists(st.integers(), min_size=0, max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.text(max_size=8),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**40), max_value=2**40),
)


def refused(bound: Bound, key: str, kind: str, value) -> bool:
    """Whether the field's type refuses ``value`` (pydantic's check of ``bound.type``: number strings read as
    numbers)."""
    try:
        TypeAdapter(bound.type).validate_python(value)
    except ValidationError:
        return True
    return False


def field_kinds(cls) -> dict[str, str]:
    from dataclasses import fields

    return {f.name: str(f.type) for f in fields(cls)}


@pytest.fixture
def tripwires(monkeypatch):
    """Anything that would launch compute fails the test loudly instead of running."""

    def launched(*a, **k):
        raise AssertionError("compute was launched for a bad input")

    import orchestrator.cluster.ray_start
    import orchestrator.execution.tuner
    import trainables.trial

    monkeypatch.setattr(trainables.trial, "run_trial", launched)
    monkeypatch.setattr(trainables.trial, "build_trainer", launched)
    monkeypatch.setattr(trainables.trial, "ensure_ray", launched)
    monkeypatch.setattr(orchestrator.cluster.ray_start, "start_quiet_ray", launched)
    monkeypatch.setattr(orchestrator.execution.tuner, "build_tuner", launched)


def one_line_exit_2(capsys, argv: list[str], command: str) -> str:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bcrit {command}: error:"), err
    assert "\n" not in err and "Traceback" not in err, err
    return err


# --- the trial config of `bcrit train` ----------------------------------------------------------------------------
KINDS = field_kinds(TrialConfig)


@st.composite
def bad_trial_value(draw, bounds: dict[str, Bound], kinds: dict[str, str], skip=()):
    key = draw(st.sampled_from(sorted(k for k in bounds if k not in skip)))
    b = bounds[key]
    near = st.nothing()
    if b.kind in ("int", "float"):
        lo = -1e12 if b.lo is None else b.lo
        hi = 1e12 if b.hi is None else b.hi
        near = st.one_of(
            st.floats(max_value=lo, allow_nan=False) if b.lo is not None else st.nothing(),
            st.floats(min_value=hi, allow_nan=False) if b.hi is not None else st.nothing(),
            st.integers(max_value=int(math.floor(lo))) if b.lo is not None else st.nothing(),
            st.integers(min_value=int(math.ceil(hi))) if b.hi is not None else st.nothing(),
        )
    value = draw(st.one_of(near, JUNK))
    assume(key != "extra" or not isinstance(value, dict))
    assume(refused(b, key, kinds[key], value))
    return key, value


@SETTINGS
@given(case=bad_trial_value(BOUNDS, KINDS))
def test_train_any_bad_trial_key(tmp_path, capsys, tripwires, case):
    key, value = case
    path = tmp_path / "trial.yaml"
    path.write_text(yaml.safe_dump({**TRIAL, key: value}))
    storage = tmp_path / "runs"
    one_line_exit_2(capsys, ["train", str(path), "--storage", str(storage), "--name", "t"], "train")
    assert not (storage / "t").exists()


# --- the sweep spec of `bcrit sweep` ------------------------------------------------------------------------------
QKINDS = field_kinds(QuadraticConfig)
SPEC_BAD = {  # spec-level keys (trial-config keys under fixed/stopping/nuisance come from the bounds table)
    ("name",): ["", "a/b", 5, [], {"a": 1}, True],
    ("workload",): ["dits", 5, [], None, True],
    ("scientific",): [[], "x", 5],
    ("scientific", "batch_sizes"): [[], [0], [-16], "16", [1.5], [16, 16], 16, None, [True], [[16]]],
    ("scientific", "splits"): [[], "x", [5], [{"grad_accum": 0}], [{"num_workers": -1}], [{"micro_batch_size": 3}]],
    ("scientific", "per_batch_size"): [[1], {999: [{"grad_accum": 1}]}, {16: "x"}, {16: []}, "x"],
    ("scientific", "use_gpu"): ["maybe", 5, [], True],
    ("scientific", "cpus_per_worker"): [0, -1, "x", 1.5, True, 10**6],
    ("nuisance",): [[], "x"],
    ("nuisance", "search"): ["random", 5, [], None],
    ("nuisance", "lr"): [[], [-1], "abc", {"low": 1}, [True], [0.0], [float("nan")], None],
    ("nuisance", "trials_per_batch_size"): [3, 0, "x"],
    ("nuisance", "seed"): [-1, "x", 1.5, [1]],
    ("fixed",): [[], "x", 5],
    ("fixed", "seeds"): [[-1], "x", [], [1.5], [True], None],
    ("stopping",): [[], "x"],
    ("tracking",): [[], "x"],
    ("tracking", "mlflow_uri"): [5, "", "foo://bar", "/some/dir", "file:///tmp/x", "http://127.0.0.1:9", []],
    ("tracking", "experiment"): [5, "", [], {"a": 1}],
    ("storage",): ["/proc/bcrit-x", 5, "", [], {"a": 1}],
}


def put(spec: dict, path: tuple, value) -> dict:
    node = spec
    for p in path[:-1]:
        node = node.setdefault(p, {})
    node[path[-1]] = value
    return spec


@st.composite
def bad_spec(draw, tmp):
    spec = quadratic_spec(tmp)
    kind = draw(st.sampled_from(["spec", "fixed", "stopping", "nuisance"]))
    if kind == "spec":
        path = draw(st.sampled_from(sorted(SPEC_BAD, key=str)))
        return put(spec, path, draw(st.sampled_from(SPEC_BAD[path])))
    if kind == "fixed":
        skip = {*OWNED, "grad_accum"}
        key, value = draw(bad_trial_value(QuadraticConfig.BOUNDS, QKINDS, skip=skip))
        return put(spec, ("fixed", key), value)
    if kind == "stopping":
        key = draw(st.sampled_from(["target_loss", "max_steps", "divergence_factor"]))
        value = draw(st.one_of(JUNK, st.sampled_from([-1, 0, 0.5, float("nan")])))
        assume(refused(QuadraticConfig.BOUNDS[key], key, QKINDS[key], value))
        return put(spec, ("stopping", key), value)
    key = draw(st.sampled_from(["lr", "warmup_steps", "beta2", "weight_decay"]))
    value = draw(st.one_of(JUNK, st.sampled_from([-10, -1, 1.5, 0.0])))
    assume(refused(BOUNDS[key], key, "float" if key != "warmup_steps" else "int", value))
    # a list drawn as the value is a grid of its elements (which may all be valid): wrap it
    return put(spec, ("nuisance", key), [value] if isinstance(value, list) else draw(st.sampled_from([[value], value])))


@SETTINGS
@given(data=st.data())
def test_sweep_any_bad_spec_key(tmp_path, capsys, tripwires, no_ray_address, data):
    import ray

    spec = data.draw(bad_spec(tmp_path))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    was = ray.is_initialized()
    one_line_exit_2(capsys, ["sweep", str(path)], "sweep")
    assert ray.is_initialized() == was
    assert not (tmp_path / "sweep" / "tune").exists()


# --- YAML itself ------------------------------------------------------------------------------------------------
def test_duplicate_yaml_key_refused(tmp_path, capsys, tripwires, no_ray_address):
    spec = tmp_path / "spec.yaml"
    text = yaml.safe_dump(quadratic_spec(tmp_path), sort_keys=False)
    spec.write_text(text + "scientific: {batch_sizes: [8], splits: [{grad_accum: 1}]}\n")
    err = one_line_exit_2(capsys, ["sweep", str(spec)], "sweep")
    assert "duplicate key 'scientific'" in err and "line" in err
    trial = tmp_path / "t.yaml"
    trial.write_text("preset: tiny\nlr: 1.0e-3\nmax_steps: 5\nlr: 2.0e-3\n")
    err = one_line_exit_2(capsys, ["train", str(trial)], "train")
    assert "duplicate key 'lr' (first on line 2)" in err


def test_empty_trial_yaml_refused(tmp_path, capsys, tripwires):
    trial = tmp_path / "t.yaml"
    trial.write_text("# nothing\n")
    assert "is empty" in one_line_exit_2(capsys, ["train", str(trial)], "train")


def test_garbled_saved_spec_on_resume(tmp_path, capsys, tripwires, no_ray_address):
    d = tmp_path / "sweep"
    d.mkdir()
    (d / "sweep_spec.yaml").write_text("name: q\nscientific: [unclosed\n")
    err = one_line_exit_2(capsys, ["sweep", str(d), "--resume"], "sweep")
    assert "sweep_spec.yaml" in err and "not valid YAML" in err


def test_trial_larger_than_the_machine_names_its_cores(tmp_path, capsys, tripwires, no_ray_address):
    spec = quadratic_spec(tmp_path, scientific={"batch_sizes": [64], "splits": [{"num_workers": 64}]})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    err = one_line_exit_2(capsys, ["sweep", str(path)], "sweep")
    assert f"this machine ({os.cpu_count()} cores" in err and "needs 65 CPUs" in err
