"""stopping.behind's driver side (orchestrator.features.stop_behind.behind_callback): the callback builds each trial's
curve from
its results' rows, names the trials the rule finds behind to the sweep's signal actor once each, and gives a stopped
trial's last result its reason, which the tables and MLflow then record."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from analysis.core import metrics as M
from orchestrator.features.stop_behind.behind_callback import StopBehind
from orchestrator.records.runs_tables import trial_row

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _trial(tid: str, lr: float, seed: int, b: int = 64) -> SimpleNamespace:
    cfg = {"batch_size": b, "micro_batch_size": b, "lr": lr, "seed": seed, "warmup_steps": 5, "target_loss": 0.2}
    return SimpleNamespace(trial_id=tid, config={"trial": cfg})


def _rows(steps, losses):
    return [[s, s * 64, M.EVAL_LOSS, v, 0.0, 0.0] for s, v in zip(steps, losses, strict=True)]


@pytest.fixture
def marked(monkeypatch):
    told: list[list[str]] = []
    monkeypatch.setattr("trainables.sweep_signal.mark_behind", lambda name, ids: told.append(list(ids)))
    monkeypatch.setattr("trainables.sweep_signal.open_signal", lambda name: None)  # live: test_goal_signal
    return told


def test_the_callback_names_trials_behind_once_and_records_why(tmp_path, marked):
    cb = StopBehind(str(tmp_path), "sig", every_s=0.0)
    steps = list(range(0, 101, 10))
    for s in range(3):  # the best lr's 3 seeds reach the target at step 100
        t = _trial(f"best{s}", 3e-3, s)
        cb.on_trial_result(0, [], t, {"status": M.STATUS_RUNNING, "rows": _rows(steps[:6], np.linspace(1, 0.6, 6))})
        res = {"status": M.STATUS_REACHED_TARGET, "rows": _rows(steps[6:], np.linspace(0.5, 0.2, 5))}
        cb.on_trial_result(0, [], t, res)
    far = [_trial(f"far{lr:g}-{s}", lr, s) for lr in (1e-3, 2e-3, 4e-3, 8e-3) for s in range(3)]
    run = list(range(0, 201, 10))
    for t in far:
        cb.on_trial_result(0, [], t, {"status": M.STATUS_RUNNING, "rows": _rows(run, np.linspace(1, 0.5, len(run)))})
    named = {t for batch in marked for t in batch}
    far_ids = {t.trial_id for t in far}
    stopped = {t.trial_id for t in far if t.config["trial"]["lr"] in (1e-3, 8e-3)}
    assert named == stopped and named <= far_ids  # the best's lr neighbours (2e-3, 4e-3) run on
    assert sum(len(b) for b in marked) == len(named)  # each named once
    t = next(t for t in far if t.trial_id in named)
    last = {"status": M.STATUS_BEHIND, "rows": [], M.STEP: 200}
    cb.on_trial_result(0, [], t, last)
    assert "behind B=64's lr 0.003" in last[M.STOP_REASON]
    assert trial_row(t.trial_id, t.config["trial"], M.STATUS_BEHIND, last)[M.STOP_REASON] == last[M.STOP_REASON]
    cb.decide(force=True)
    assert sum(len(b) for b in marked) == len(named)  # nothing named twice


def test_a_resumed_sweep_reads_its_finished_trials_back(tmp_path, marked):
    from tests.oracles.sweep_dir import write_sweep_dir
    from tests.oracles.synth_shapes import SHAPES
    from tests.oracles.synth_sweeps import simulate

    runs = simulate(np.random.default_rng(0), SHAPES["issue"])
    write_sweep_dir(runs, tmp_path)
    cb = StopBehind(str(tmp_path), "sig")
    cb.setup()
    assert len(cb.curves) == len(runs.trial_ids)
    assert all(c.status in M.FINAL_STATUSES for c in cb.curves.values())


def test_planned_seeds_key_settings_as_the_trials_receive_them(tmp_path):
    """The seeds each setting will have are counted on the configs the trials get (beta2 and weight_decay filled
    in), so that a trial's curve (keyed by its own config) finds them: keyed on the spec's raw configs every
    examples/tiny.yaml setting got the default 0 and counted as known after its first seed."""
    from analysis.features.stop_behind.stop_behind import setting_of
    from orchestrator.execution.preflight import check_spec
    from orchestrator.execution.tuner import planned_seeds
    from orchestrator.specs.sweep_spec import load_spec

    spec = load_spec(os.path.join(ROOT, "examples", "tiny.yaml"), sweep_dir=str(tmp_path / "s"))
    configs = check_spec(spec, {"CPU": 64.0, "GPU": 0.0})
    for seeds in (planned_seeds(spec, configs), planned_seeds(spec)):
        assert {seeds.of(c["batch_size"], setting_of(c)) for c in configs} == {3}
