"""An adaptive sweep's word to its running trials (trainables.sweep_signal) on a real Ray: the driver sets the named
actor, a trial of the bcrit trainable -- in the Tune actor (``num_workers: 0``) and on a Ray Train worker
(``num_workers: 1``) -- asks it at each evaluation and ends itself with ``ended_at_goal``; unset, it trains on."""

from __future__ import annotations

import pytest

from analysis.core import metrics as M
from orchestrator.execution.tune_trainable import make_trainable
from trainables.nqm_trial import QuadraticConfig
from trainables.sweep_signal import SignalReader, mark_behind, set_signal, signal_name

pytestmark = pytest.mark.ray


def _trial(tmp_path, name: str | None, num_workers: int, tag: str, callbacks=()) -> dict:
    from ray import tune

    cfg = QuadraticConfig(dim=20, batch_size=16, micro_batch_size=16, num_workers=num_workers, lr=0.5, max_steps=30,
                          eval_every=5, report_every=5, target_loss=1e-6)  # fmt: skip
    fn = make_trainable("quadratic", str(tmp_path / "sweep"), signal=name)
    tuner = tune.Tuner(
        tune.with_resources(fn, {"CPU": 1}),
        param_space={"trial": cfg.to_dict()},
        run_config=tune.RunConfig(name=tag, storage_path=str(tmp_path / "tune"), verbose=0, callbacks=list(callbacks)),
    )
    (result,) = tuner.fit()
    assert result.error is None
    return result.metrics


@pytest.mark.parametrize("num_workers", [0, pytest.param(1, marks=pytest.mark.slow)])  # a Train run: ~20 s each
def test_a_trial_ends_itself_when_its_sweep_says_so(tmp_path, ray_local, no_ray_address, num_workers):
    name = signal_name(str(tmp_path / "sweep"))
    assert not SignalReader(name)()  # no actor yet: keep training
    set_signal(name, True)
    assert SignalReader(name)()
    ended = _trial(tmp_path, name, num_workers, "ended")
    assert ended["status"] == M.STATUS_ENDED and ended[M.STEP] == 5  # the first evaluation after step 0
    set_signal(name, False)  # reset (a resumed sweep's driver): trains to its budget
    assert _trial(tmp_path, name, num_workers, "reset")["status"] == M.STATUS_BUDGET_SPENT
    set_signal(name, True)
    assert _trial(tmp_path, None, num_workers, "none")["status"] == M.STATUS_BUDGET_SPENT  # no signal: never asks


@pytest.mark.parametrize("num_workers", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_trial_the_sweep_names_stops_alone_as_behind(tmp_path, ray_local, no_ray_address, num_workers):
    """stopping.behind's word (orchestrator.execution.stop_behind): the driver names one trial by its Tune id; that
    trial ends with ``stopped_behind`` at its next evaluation, and the sweep's other trials are not asked to end."""
    from ray.tune import Callback

    name = signal_name(str(tmp_path / "sweep"))

    class NameIt(Callback):  # as StopBehind does, once the trial has started
        def on_trial_start(self, iteration, trials, trial, **info):
            mark_behind(name, [trial.trial_id])

    stopped = _trial(tmp_path, name, num_workers, "behind", callbacks=[NameIt()])
    assert stopped["status"] == M.STATUS_BEHIND and stopped[M.STEP] <= 10
    assert SignalReader(name, "another-trial")() is None
    assert SignalReader(name, stopped["trial_id"])() == M.STATUS_BEHIND


def test_stop_behind_creates_the_actor_before_any_trial_asks(tmp_path, ray_local, no_ray_address):
    """The callback's setup creates the signal actor, so a trial's first ask finds it (no failed lookup per
    evaluation until the first trial is named), unset: nobody is told to stop. Later asks do not wait on the actor:
    a word arrives at a later ask, and then stays."""
    import time

    from orchestrator.features.stop_behind.behind_callback import StopBehind

    name = signal_name(str(tmp_path / "sweep"))
    missing = SignalReader(name, "a-trial")
    assert missing() is None and missing._actor is None  # no actor yet
    StopBehind(str(tmp_path / "sweep"), name).setup()
    reader = SignalReader(name, "a-trial")
    assert reader() is None and reader._actor is not None  # found, and it says train on
    mark_behind(name, ["a-trial"])
    for _ in range(100):
        if reader():
            break
        time.sleep(0.05)
    assert reader() == M.STATUS_BEHIND and reader() == M.STATUS_BEHIND
    assert SignalReader(name, "another-trial")() is None
