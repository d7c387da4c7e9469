"""The trial skeleton with a tiny fake learner: counters, evaluation schedule, stop status, reports and their rows,
checkpoints (saving, keeping, restoring, re-sending the rows after a restore)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace

import pytest

from analysis.core import metrics as M
from analysis.core.stages import BatchStages
from trainables.branch_points import kept_path
from trainables.skeleton import Learner, StepOutcome, TrialSkeleton
from trainables.trial import LocalSession

STATE = "fake.json"
STEP_SECONDS, FLUSH_SECONDS = 0.5, 0.25  # exact in binary: train_seconds compare with ==


@dataclass(frozen=True)
class Cfg:
    batch_size: int = 8
    accum: int = 2
    max_steps: int = 6
    eval_every: int = 2
    report_every: int = 0
    checkpoint_every: int = 0
    divergence_factor: float = 3.0
    target_loss: float | None = None
    init_from: str | None = None
    keep_dir: str | None = None
    keep_steps: list = field(default_factory=list)

    @property
    def report_interval(self) -> int:
        return self.report_every or self.eval_every

    @property
    def stages(self) -> BatchStages:
        return BatchStages((0,), (self.batch_size,))


class Halving(Learner):
    """``x`` halves every step (or grows by ``growth``); the evaluation loss is ``x``. A step at ``nan_at`` is
    non-finite."""

    train_size = 32

    def __init__(self, x: float = 1.0, growth: float = 0.5, nan_at: int | None = None):
        self.x, self.growth, self.nan_at = x, growth, nan_at
        self.calls: list[str] = []

    def step(self, step):
        self.calls.append(f"step{step}")
        self.x *= self.growth
        return StepOutcome(STEP_SECONDS, {M.TRAIN_LOSS: self.x, M.LR: 0.1}, finite=step + 1 != self.nan_at)

    def evaluate(self):
        self.calls.append("eval")
        return {M.EVAL_LOSS: self.x, M.per_bin(M.EVAL_LOSS_BIN, 0): 2 * self.x}

    def state_dict(self):
        return {"x": self.x}

    def load_state_dict(self, state):
        self.x = state["x"]

    def save(self, directory, state):
        with open(os.path.join(directory, STATE), "w") as f:
            json.dump(state(), f, default=lambda a: a.tolist())

    def load(self, directory):
        with open(os.path.join(directory, STATE)) as f:
            return json.load(f)

    def branch_from(self, init_from):
        self.calls.append(f"branch {init_from}")
        self.x = self.load(init_from)["x"]

    def start(self, step, train_seconds):
        self.calls.append(f"start{step}")

    def flush(self):
        return FLUSH_SECONDS

    def interval(self, step, train_seconds):
        return {M.SYS_EXAMPLES_PER_S: train_seconds}


def run(cfg: Cfg, learner: Learner | None = None, root=None, resume_from=None):
    session = LocalSession(str(root) if root else None, resume_from)
    trial = TrialSkeleton(cfg, session, learner or Halving())
    trial.restore()
    trial.run()
    return trial, session


def rows(session, metric=None):
    return [r for rep in session.reports for r in rep["rows"] if metric is None or r[2] == metric]


def steps_of(session, metric):
    return [r[0] for r in rows(session, metric)]


# --- counters, schedule, reports ------------------------------------------------------------------------------
def test_counters_rows_and_schedule():
    trial, s = run(Cfg(max_steps=5, eval_every=2))
    assert [rep[M.STEP] for rep in s.reports] == [0, 2, 4, 5]  # every report_interval steps, and at the end
    last = s.reports[-1]
    assert (last[M.STEP], last[M.MICRO_STEP], last[M.EXAMPLES]) == (5, 10, 40)
    assert all(type(last[k]) is int for k in (M.STEP, M.MICRO_STEP, M.EXAMPLES))  # printed "10", not "10.0"
    assert last[M.EPOCH] == 40 / 32
    assert last["status"] == M.STATUS_BUDGET_SPENT and trial.status == M.STATUS_BUDGET_SPENT
    assert last["worker_pid"] == os.getpid() and last["startup_seconds"] >= 0
    assert steps_of(s, M.EVAL_LOSS) == [0, 2, 4, 5]  # step 0, every eval_every, and at the budget
    assert steps_of(s, M.TRAIN_LOSS) == [1, 2, 3, 4, 5]
    assert [r[1] for r in rows(s, M.TRAIN_LOSS)] == [8, 16, 24, 32, 40]  # examples = step x batch_size
    assert last[M.EVAL_LOSS] == 0.5**5 and last[M.TRAIN_LOSS] == 0.5**5  # the latest value of every metric
    # a step's values in the learner's order, then the evaluation's, then the interval's
    assert [r[2] for r in rows(s) if r[0] == 2] == [
        M.TRAIN_LOSS, M.LR, M.EVAL_LOSS, M.per_bin(M.EVAL_LOSS_BIN, 0), M.SYS_EXAMPLES_PER_S,
    ]  # fmt: skip
    assert trial.learner.calls[:3] == ["eval", "start0", "step0"]


def test_train_seconds_count_steps_and_flushes():
    trial, s = run(Cfg(max_steps=4, eval_every=2))
    # 4 steps, 2 reports after steps (each flushes the learner's uncounted seconds)
    assert trial.train_seconds == 4 * STEP_SECONDS + 2 * FLUSH_SECONDS
    assert [r[4] for r in rows(s, M.TRAIN_LOSS)] == [0.5, 1.0, 1.75, 2.25]  # wall_time: flushed after the step's rows
    assert [r[3] for r in rows(s, M.SYS_EXAMPLES_PER_S)] == [1.25, 2.5]  # interval() sees the flushed seconds
    assert s.reports[-1]["train_seconds"] == 2.5


def test_report_every_is_separate_from_eval_every():
    _, s = run(Cfg(max_steps=6, eval_every=3, report_every=2))
    assert [rep[M.STEP] for rep in s.reports] == [0, 2, 4, 6]
    assert steps_of(s, M.EVAL_LOSS) == [0, 3, 6]


# --- stop status ------------------------------------------------------------------------------------------------
def test_target_reached_at_first_crossing():
    trial, s = run(Cfg(max_steps=50, eval_every=1, target_loss=0.1))
    assert trial.status == M.STATUS_REACHED_TARGET and trial.step == 4  # 0.5**4 = 0.0625 <= 0.1 < 0.5**3
    assert s.reports[-1]["status"] == M.STATUS_REACHED_TARGET


def test_target_reached_at_step_zero_trains_nothing():
    trial, s = run(Cfg(target_loss=1.0))
    assert trial.status == M.STATUS_REACHED_TARGET and trial.step == 0 and len(s.reports) == 1
    assert not any(c.startswith("step") for c in trial.learner.calls)


def test_divergence_against_the_first_evaluation():
    trial, _ = run(Cfg(max_steps=50, eval_every=1, divergence_factor=3.0), Halving(growth=2.0))
    assert trial.status == M.STATUS_DIVERGED and trial.step == 2  # 4 > 3 x 1 at step 2, 2 <= 3 at step 1


def test_non_finite_step_diverges_without_evaluating():
    trial, s = run(Cfg(max_steps=50, eval_every=10), Halving(nan_at=3))
    assert trial.status == M.STATUS_DIVERGED and trial.step == 3
    assert steps_of(s, M.EVAL_LOSS) == [0]
    assert s.reports[-1][M.STEP] == 3 and s.reports[-1]["status"] == M.STATUS_DIVERGED


def test_non_finite_evaluation_diverges():
    trial, _ = run(Cfg(max_steps=50, eval_every=1), Halving(growth=math.inf))
    assert trial.status == M.STATUS_DIVERGED and trial.step == 1


# --- checkpoints ------------------------------------------------------------------------------------------------
def test_checkpoints_on_schedule_and_at_the_end(tmp_path):
    _, s = run(Cfg(max_steps=5, eval_every=1, checkpoint_every=2), root=tmp_path)
    assert [os.path.basename(c) for c in s.checkpoints] == [f"checkpoint_step{n:08d}" for n in (0, 2, 4, 5)]
    with open(os.path.join(s.checkpoints[-1], STATE)) as f:
        state = json.load(f)
    assert state["x"] == 0.5**5 and state["step"] == 5 and state["status"] == M.STATUS_BUDGET_SPENT
    assert state["first_eval"] == 1.0 and state["train_seconds"] == 5 * STEP_SECONDS + 5 * FLUSH_SECONDS
    assert state["last"][M.EVAL_LOSS] == 0.5**5
    assert len(state["row_log"]["step"]) == len(rows(s))  # every row reported so far


def test_no_checkpoint_without_checkpoint_every_until_the_end(tmp_path):
    _, s = run(Cfg(max_steps=4, eval_every=1), root=tmp_path)
    assert [os.path.basename(c) for c in s.checkpoints] == ["checkpoint_step00000004"]


def test_branch_points_are_kept(tmp_path):
    keep = tmp_path / "kept"
    run(Cfg(max_steps=6, eval_every=2, checkpoint_every=2, keep_dir=str(keep), keep_steps=[2, 6]))
    assert sorted(os.listdir(keep)) == [os.path.basename(kept_path(str(keep), n)) for n in (2, 6)]
    with open(os.path.join(kept_path(str(keep), 2), STATE)) as f:
        assert json.load(f)["x"] == 0.25


def test_resume_continues_exactly_and_resends_the_logged_rows(tmp_path):
    cfg = Cfg(max_steps=8, eval_every=2, checkpoint_every=4)
    _, straight = run(cfg)
    _, first = run(replace(cfg, max_steps=4), root=tmp_path)
    trial, resumed = run(cfg, resume_from=first.checkpoints[-1])  # budget 4 spent, then extended to 8
    sent = resumed.reports[0]["rows"]
    assert sent[: len(rows(first))] == rows(first)  # re-sent once, with the first new rows
    assert not any(r in rows(first) for rep in resumed.reports[1:] for r in rep["rows"])

    def values(session):
        return [(r[0], r[2], r[3], r[4]) for r in rows(session)]

    new = [v for v in values(resumed) if v[0] > 4]
    assert values(first) + new == values(straight)  # same rows, values and training seconds
    assert trial.status == M.STATUS_BUDGET_SPENT and trial.step == 8
    assert "eval" not in trial.learner.calls[:2]  # no second step-0 evaluation after a restore


def test_restored_final_trial_reports_once_and_trains_nothing(tmp_path):
    _, done = run(Cfg(max_steps=4), root=tmp_path)
    trial, again = run(Cfg(max_steps=4), root=tmp_path / "again", resume_from=done.checkpoints[-1])
    assert len(again.reports) == 1 and again.reports[0]["rows"] == rows(done)
    assert again.reports[0]["status"] == M.STATUS_BUDGET_SPENT and again.reports[0][M.EVAL_LOSS] == 0.5**4
    assert again.checkpoints == []  # said once, not saved again
    assert trial.learner.calls == ["start4"]


@pytest.mark.parametrize("status", [M.STATUS_REACHED_TARGET, M.STATUS_DIVERGED])
def test_larger_budget_does_not_revive_a_finished_trial(tmp_path, status):
    cfg = Cfg(max_steps=10, target_loss=0.1, eval_every=1) if status == M.STATUS_REACHED_TARGET else Cfg(max_steps=4)
    learner = Halving() if status == M.STATUS_REACHED_TARGET else Halving(nan_at=2)
    _, done = run(cfg, learner, root=tmp_path)
    assert done.reports[-1]["status"] == status
    trial, _ = run(replace(cfg, max_steps=40), resume_from=done.checkpoints[-1])
    assert trial.status == status and trial.step == done.reports[-1][M.STEP]


def test_init_from_starts_a_branch_with_counters_at_zero(tmp_path):
    _, ref = run(Cfg(max_steps=3, eval_every=1), root=tmp_path)
    trial, s = run(Cfg(max_steps=2, eval_every=1, init_from=ref.checkpoints[-1]))
    assert trial.learner.calls[0] == f"branch {ref.checkpoints[-1]}"
    assert rows(s, M.EVAL_LOSS)[0][:4] == [0, 0, M.EVAL_LOSS, 0.5**3]  # the reference's x, at step 0
    assert trial.step == 2 and trial.status == M.STATUS_BUDGET_SPENT


def test_restore_wins_over_init_from(tmp_path):
    _, own = run(Cfg(max_steps=2, eval_every=1), root=tmp_path)
    trial, _ = run(Cfg(max_steps=3, eval_every=1, init_from="/nonexistent"), resume_from=own.checkpoints[-1])
    assert not any(c.startswith("branch") for c in trial.learner.calls) and trial.step == 3


def test_learner_defaults():
    class Bare(Learner):
        pass

    bare = Bare()
    assert bare.train_size is None and bare.flush() == 0.0 and bare.interval(3, 1.0) == {}
    assert bare.start(0, 0.0) is None and bare.close() is None
    for call in (lambda: bare.step(0), bare.evaluate, bare.state_dict, lambda: bare.load_state_dict({})):
        with pytest.raises(NotImplementedError):
            call()
    for call in (lambda: bare.save("d", dict), lambda: bare.load("d")):
        with pytest.raises(NotImplementedError):
            call()
    with pytest.raises(NotImplementedError, match=r"^Bare cannot start from a checkpoint \(init_from\)$"):
        bare.branch_from("ckpt")


def test_a_learner_without_epochs_reports_epoch_zero():
    class Fresh(Halving):
        train_size = None

    _, s = run(Cfg(max_steps=2), Fresh())
    assert [rep[M.EPOCH] for rep in s.reports] == [0.0, 0.0] and s.reports[-1][M.EXAMPLES] == 16


def test_startup_seconds_from_the_given_start_to_the_end_of_restore(monkeypatch):
    import trainables.skeleton as skeleton

    monkeypatch.setattr(skeleton, "CLOCK", lambda: 10.0)
    trial = TrialSkeleton(Cfg(max_steps=1), LocalSession(), Halving(), started=4.0)
    trial.restore()
    assert trial.startup_seconds == 6.0
    trial = TrialSkeleton(Cfg(max_steps=1), LocalSession(), Halving())  # default: from construction
    trial.restore()
    assert trial.startup_seconds == 0.0


def test_a_fresh_trial_may_run_without_restore():
    s = LocalSession()
    trial = TrialSkeleton(Cfg(max_steps=2), s, Halving())
    assert trial.run() == M.STATUS_BUDGET_SPENT
    assert [rep["startup_seconds"] for rep in s.reports] == [0.0, 0.0]
    assert steps_of(s, M.EVAL_LOSS) == [0, 2]


def test_a_checkpoint_without_status_resumes_running(tmp_path):
    _, first = run(Cfg(max_steps=2), root=tmp_path)
    path = os.path.join(first.checkpoints[-1], STATE)
    with open(path) as f:
        state = json.load(f)
    del state["status"]  # written before the status was saved
    with open(path, "w") as f:
        json.dump(state, f)
    trial, _ = run(Cfg(max_steps=4), resume_from=first.checkpoints[-1])
    assert trial.status == M.STATUS_BUDGET_SPENT and trial.step == 4


def test_restored_at_step_zero_does_not_evaluate_again(tmp_path):
    _, first = run(Cfg(max_steps=4, checkpoint_every=2), root=tmp_path)
    assert first.checkpoints[0].endswith("checkpoint_step00000000")  # the initial report's checkpoint
    trial, s = run(Cfg(max_steps=4, checkpoint_every=2), resume_from=first.checkpoints[0])
    assert trial.learner.calls[:2] == ["start0", "step0"]
    assert steps_of(s, M.EVAL_LOSS) == [0, 2, 4]  # step 0's evaluation only in the re-sent rows
    assert s.reports[0]["rows"][: len(first.reports[0]["rows"])] == first.reports[0]["rows"]


def test_a_trial_ended_by_its_first_evaluation_is_checkpointed(tmp_path):
    _, s = run(Cfg(target_loss=1.0), root=tmp_path)
    assert [os.path.basename(c) for c in s.checkpoints] == ["checkpoint_step00000000"]


# --- ended by its sweep (trainables.sweep_signal) --------------------------------------------------------------
class Told(LocalSession):
    """A session whose sweep asks its trials to end from the ``at``-th question on (rank ``rank``)."""

    def __init__(self, at: int, rank: int = 0):
        super().__init__()
        self.at, self.rank, self.asked = at, rank, 0

    def sweep_ended(self) -> bool:
        self.asked += 1
        return self.asked >= self.at


def test_a_trial_the_sweep_ends_stops_at_an_evaluation_with_a_final_report():
    session = Told(at=2)
    trial = TrialSkeleton(Cfg(max_steps=20, eval_every=2), session, Halving())
    trial.restore()
    assert trial.run() == M.STATUS_ENDED
    assert trial.step == 4 and session.asked == 2  # asked after each evaluation that left it running: steps 2, 4
    assert session.reports[-1]["status"] == M.STATUS_ENDED and session.reports[-1][M.STEP] == 4
    assert steps_of(session, M.EVAL_LOSS) == [0, 2, 4]  # its rows up to there are reported
    assert M.STATUS_ENDED in M.FINAL_STATUSES


class Named(Told):
    """A session whose sweep names this trial as behind its batch size's best from the ``at``-th question on."""

    def sweep_ended(self):
        return M.STATUS_BEHIND if super().sweep_ended() else None


def test_a_trial_the_sweep_names_as_behind_stops_with_that_status_and_a_final_report():
    session = Named(at=3)
    trial = TrialSkeleton(Cfg(max_steps=20, eval_every=2), session, Halving())
    trial.restore()
    assert trial.run() == M.STATUS_BEHIND
    assert trial.step == 6 and session.reports[-1]["status"] == M.STATUS_BEHIND
    assert steps_of(session, M.EVAL_LOSS) == [0, 2, 4, 6]
    assert M.STATUS_BEHIND in M.FINAL_STATUSES


def test_only_rank_0_asks_and_a_trial_without_a_sweep_never_ends():
    other = Told(at=1, rank=1)  # rank 1 does not ask; one process: its own answer is rank 0's (none)
    trial = TrialSkeleton(Cfg(max_steps=6), other, Halving())
    trial.restore()
    assert trial.run() == M.STATUS_BUDGET_SPENT and other.asked == 0
    trial, _ = run(Cfg(max_steps=6))  # LocalSession: no sweep_ended
    assert trial.status == M.STATUS_BUDGET_SPENT


def _agree_worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    got = [Learner().agree(flag) for flag in ((rank == 0), (rank != 0), False)]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()


def test_every_rank_gets_rank_0s_answer(tmp_path):
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from ddp_group import run_group

    got = run_group(_agree_worker, 2, tmp_path, timeout_s=120)
    assert got == [[True, False, False], [True, False, False]]  # rank 0's flag, whatever the others had
