"""Stop rules (`trainables.stopping`): the verdict of each evaluation, the cadence, and a trial that reaches its
target at a later evaluation (not the first) stopping exactly there."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.core import metrics as M
from trainables.config import TrialConfig
from trainables.stopping import eval_status, status_after_step
from trainables.trial import run_local

RUNNING, TARGET, DIVERGED, BUDGET = (
    M.STATUS_RUNNING,
    M.STATUS_REACHED_TARGET,
    M.STATUS_DIVERGED,
    M.STATUS_BUDGET_SPENT,
)


def test_eval_status_boundaries() -> None:
    assert eval_status(0.5, 1.0, 3.0, None) == RUNNING  # no target: never reached
    assert eval_status(0.5, 1.0, 3.0, 0.5) == TARGET  # <= target (equal counts)
    assert eval_status(0.5000001, 1.0, 3.0, 0.5) == RUNNING
    assert eval_status(0.4, 1.0, 3.0, 0.5) == TARGET
    assert eval_status(3.0, 1.0, 3.0, None) == RUNNING  # exactly factor x first: not yet diverged
    assert eval_status(3.0000001, 1.0, 3.0, None) == DIVERGED
    assert eval_status(5.0, 2.0, 3.0, None) == RUNNING  # relative to the first evaluation, not to 1
    assert eval_status(6.5, 2.0, 3.0, None) == DIVERGED
    for bad in (math.nan, math.inf, -math.inf):
        assert eval_status(bad, 1.0, 3.0, 10.0) == DIVERGED  # non-finite is divergence, even "below" the target
    assert eval_status(0.0, 1.0, 3.0, 0.0) == TARGET


@settings(max_examples=200, deadline=None)
@given(
    loss=st.floats(0, 100, allow_nan=False),
    first=st.floats(0.01, 100),
    factor=st.floats(1.01, 10),
    target=st.none() | st.floats(0, 100),
)
def test_eval_status_is_the_documented_rule(loss, first, factor, target) -> None:
    expected = DIVERGED if loss > factor * first else TARGET if target is not None and loss <= target else RUNNING
    assert eval_status(loss, first, factor, target) == expected


def test_status_after_step_cadence_and_budget() -> None:
    calls = []

    def evaluate(verdict=RUNNING):
        def f():
            calls.append(1)
            return verdict

        return f

    assert status_after_step(3, 5, 10, evaluate()) == RUNNING and not calls  # off the cadence: no evaluation
    assert status_after_step(5, 5, 10, evaluate()) == RUNNING and len(calls) == 1
    assert status_after_step(10, 5, 10, evaluate()) == BUDGET and len(calls) == 2
    assert status_after_step(7, 5, 7, evaluate()) == BUDGET and len(calls) == 3  # the budget step is evaluated
    assert status_after_step(7, 5, 7, evaluate(TARGET)) == TARGET  # a target met at the budget is reached
    assert status_after_step(10, 5, 10, evaluate(DIVERGED)) == DIVERGED
    assert status_after_step(5, 5, 10, evaluate(TARGET)) == TARGET
    assert status_after_step(12, 5, 10, evaluate()) == BUDGET  # past the budget (a resumed, shortened trial)
    assert status_after_step(1, 1, 10, evaluate(DIVERGED)) == DIVERGED


TINY = dict(preset="tiny", batch_size=16, micro_batch_size=16, eval_every=2, eval_repeats=1, gns_every=0)


def _evals(session) -> list[tuple[int, float]]:
    return [(r[0], r[3]) for rep in session.reports for r in rep["rows"] if r[2] == M.EVAL_LOSS]


@pytest.fixture(scope="module")
def trajectory() -> list[tuple[int, float]]:
    return _evals(run_local(TrialConfig(**TINY, max_steps=30)))


def test_target_reached_at_a_later_evaluation_stops_there(trajectory) -> None:
    """The target is the loss of an evaluation after step 0 that is lower than every earlier one: the trial must
    run to exactly that step (a rule that looks at the first evaluation only, or stops one evaluation early or late,
    ends elsewhere)."""
    later = [(s, v) for i, (s, v) in enumerate(trajectory) if s >= 6 and v < min(u for _, u in trajectory[:i])]
    assert later, f"the loss never fell below its earlier values: {trajectory}"
    step, target = later[0]
    s = run_local(TrialConfig(**TINY, max_steps=30, target_loss=target))
    assert s.summary["status"] == TARGET and s.summary[M.STEP] == step
    assert _evals(s) == [(t, v) for t, v in trajectory if t <= step]  # the same trajectory up to the stop
    assert s.reports[-1]["status"] == TARGET and s.reports[-1][M.STEP] == step


def test_target_never_reached_spends_the_budget(trajectory) -> None:
    below = min(v for _, v in trajectory) * 0.5
    s = run_local(TrialConfig(**TINY, max_steps=12, target_loss=below))
    assert s.summary["status"] == BUDGET and s.summary[M.STEP] == 12
