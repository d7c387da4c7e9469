"""The trial skeleton: the bookkeeping every workload's trial shares, apart from what it trains.

A trial is a `TrialSkeleton` driving a `Learner`. The **skeleton** owns the counters (``step``; ``micro_step``,
``examples``, ``epoch`` derived from it), the training seconds, the evaluation schedule and the stop status
(`trainables.stopping`), the metric rows and their log (`trainables.row_log`, re-sent once after a restore), the
reports, and checkpoints (restoring, keeping the branch points). The **learner** supplies what differs between
workloads: model and data, one optimizer step, evaluation, its own state (`trainables.loop.DiTLearner`,
`trainables.nqm_trial.QuadraticLearner`; a sweep's entry for a workload is `tune_trainable.Workload`).

Every report carries the counters, ``status``, ``train_seconds``, ``startup_seconds``, ``worker_pid``, the latest
value of every metric, and ``rows``: every value since the previous report as ``[step, examples, metric, value,
wall_time, unix_time]`` (``metrics.parquet``'s long format). A trial stops itself (budget, target, diverged, its
sweep's word: `trainables.sweep_signal`), so its trainer returns normally (Tune stopping it leaks its placement
group: docs/design.md)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from analysis.core import metrics as M
from analysis.core.stages import BatchStages
from trainables.branch_points import keep_checkpoint
from trainables.row_log import RowLog
from trainables.stopping import eval_status, status_after_step

if TYPE_CHECKING:
    import torch

CLOCK = time.perf_counter  # start-up seconds (a test swaps in a fake clock)
VERDICTS = (None, M.STATUS_ENDED, M.STATUS_BEHIND)  # what a sweep may ask a running trial, coded for Learner.agree


class Session(Protocol):
    """The trial's runner: a Ray Train worker (`trainables.trial.RaySession`), a Tune trial actor
    (`orchestrator.execution.tune_trainable.TuneSession`) or in-process (`LocalSession`)."""

    rank: int
    world_size: int
    device: torch.device  # where this worker trains (the quadratic workload ignores it)

    def report(self, metrics: dict, checkpoint_dir: str | None) -> None: ...
    def restore(self) -> contextlib.AbstractContextManager[str | None]: ...

    # optional: ``sweep_ended() -> str | bool | None``, the status its sweep asks it to end with
    # (TrialSkeleton.sweep_verdict)


class LocalSession:
    """In-process `Session` with no Ray: reports are kept in a list, checkpoints copied under ``root`` (None: none
    kept)."""

    rank, world_size = 0, 1

    def __init__(
        self, root: str | None = None, resume_from: str | None = None, device: str = "cpu", keep: int | None = None
    ):
        self._device = device
        self.root = root
        self.resume_from = resume_from
        self.keep = keep  # newest checkpoints kept under root (None: all)
        self.reports: list[dict] = []
        self.checkpoints: list[str] = []

    @property
    def device(self) -> torch.device:
        # torch: deferred, the quadratic workload's in-process trials (the tests' in-process branched studies) load none
        import torch

        return torch.device(self._device)

    def report(self, metrics: dict, checkpoint_dir: str | None) -> None:
        self.reports.append(metrics)
        if checkpoint_dir and self.root:
            dest = os.path.join(self.root, f"checkpoint_step{metrics['step']:08d}")
            tmp = f"{dest}.tmp"  # copied whole, then renamed: a kill never leaves a partial checkpoint_* dir
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(checkpoint_dir, tmp)
            if os.path.exists(dest):
                shutil.rmtree(dest)
            os.replace(tmp, dest)
            if dest in self.checkpoints:
                self.checkpoints.remove(dest)
            self.checkpoints.append(dest)
            if self.keep:
                for old in self.checkpoints[: -self.keep]:
                    if old != self.resume_from:
                        shutil.rmtree(old, ignore_errors=True)
                self.checkpoints = self.checkpoints[-self.keep :]

    @contextlib.contextmanager
    def restore(self):
        yield self.resume_from


@contextlib.contextmanager
def opened(checkpoint):
    """A Ray checkpoint (``ray.train.get_checkpoint()`` of a Train worker, ``tune.get_checkpoint()`` of a Tune trial
    actor) as a local directory while the context lasts; None for none (a `Session`'s ``restore``)."""
    if checkpoint is None:
        yield None
    else:
        with checkpoint.as_directory() as d:
            yield d


class ScheduleConfig(Protocol):
    """The trial-config fields the skeleton reads (both `TrialConfig` and `QuadraticConfig` have them)."""

    batch_size: int
    max_steps: int
    eval_every: int
    checkpoint_every: int
    divergence_factor: float
    target_loss: float | None
    init_from: str | None
    keep_dir: str | None
    keep_steps: list

    @property
    def accum(self) -> int: ...  # of stage 0 (batch_size)
    @property
    def stages(self) -> BatchStages: ...
    @property
    def report_interval(self) -> int: ...


@dataclass(frozen=True)
class StepOutcome:
    """One optimizer step, as the learner reports it to the skeleton."""

    seconds: float  # training seconds to count for it (timing.StepTimer: on a GPU, the previous step's)
    values: dict[str, float] = field(default_factory=dict)  # metric -> value, recorded at the new step, in order
    finite: bool = True  # False: a non-finite loss or gradient; the trial ends as diverged without evaluating


class ExamplesRate:
    """``sys/examples_per_s`` of each report interval (trainables.sys_metrics defines it): the examples of the steps
    trained since the last call (each step's stage batch size) over the training seconds counted for them."""

    def __init__(self, stages: BatchStages, step: int, train_seconds: float) -> None:
        self.stages = stages
        self._step, self._seconds = step, train_seconds

    def interval(self, step: int, train_seconds: float) -> float | None:
        """The rate since the last call; None when no step was trained or no time was counted."""
        steps, seconds = step - self._step, train_seconds - self._seconds
        if steps <= 0 or seconds <= 0:
            return None
        self._step, self._seconds = step, train_seconds
        return (self.stages.examples(step) - self.stages.examples(step - steps)) / seconds


class Learner:
    """What a workload plugs into the skeleton. Subclasses implement the first six methods; the hooks after them
    default to nothing."""

    train_size: int | None = None  # training examples per epoch; None: fresh examples every step (epoch stays 0)

    def step(self, step: int) -> StepOutcome:
        """Take optimizer step number ``step + 1`` (``step`` steps are done)."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        """The held-out evaluation: ``{M.EVAL_LOSS: loss, ...more metrics}``, recorded in this order."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The learner's part of a checkpoint (the skeleton adds counters, status, latest values and row log)."""
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        """Restore from a whole checkpoint state (as `load` returns it)."""
        raise NotImplementedError

    def save(self, directory: str, state: Callable[[], dict]) -> None:
        """Write a checkpoint into ``directory``; ``state()`` builds the whole trial state (called only by the ranks
        that write it: building it copies the row log)."""
        raise NotImplementedError

    def load(self, directory: str) -> dict:
        """Read the whole trial state a `save` wrote (and whatever else the learner restores, e.g. RNG states)."""
        raise NotImplementedError

    def branch_from(self, init_from: str) -> None:
        """Start from another trial's checkpoint, counters at 0 (a branched study; trainables.branch_points)."""
        raise NotImplementedError(f"{type(self).__name__} cannot start from a checkpoint (init_from)")

    def start(self, step: int, train_seconds: float) -> None:
        """Called once before the first training step of this run (after the initial evaluation)."""

    def flush(self) -> float:
        """At each report, first: training seconds not yet counted (the last step's on a GPU: timing.StepTimer)."""
        return 0.0

    def interval(self, step: int, train_seconds: float) -> dict[str, float]:
        """At each report, then: metrics of the steps since the previous report (e.g. throughput, `M.SYS_*`)."""
        return {}

    def close(self) -> None:
        """Called once the trial has stopped."""

    def agree(self, flag: bool | int) -> bool | int:
        """Every rank's answer to a question only rank 0 asked (e.g. how the sweep ended the trial): ``flag`` (a
        bool or a small non-negative int) from rank 0, the same on every rank, through the workers' process group,
        on the learner's ``device`` when it has one (the DiT's: its GPU under NCCL), else the CPU (gloo). One
        process: ``flag``."""
        dist = sys.modules.get("torch.distributed")  # a Train worker has it; an in-process trial may lack torch
        if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
            return flag
        import torch

        device = getattr(self, "device", None) or "cpu"
        t = torch.tensor([float(flag) if dist.get_rank() == 0 else 0.0], device=device)
        dist.all_reduce(t)  # the other ranks add 0
        return bool(t.item() > 0) if isinstance(flag, bool) else int(round(t.item()))


class TrialSkeleton:
    """Counters, evaluation schedule, stop status, rows, reports and checkpoints of one trial on one worker.

    ``trial.restore()`` then ``trial.run()``; afterwards ``status``, ``step``, ``train_seconds``, ``last`` ...
    hold the outcome (identical on every rank)."""

    def __init__(self, cfg: ScheduleConfig, session: Session, learner: Learner, started: float | None = None):
        self.cfg, self.session, self.learner = cfg, session, learner
        self.started = CLOCK() if started is None else started  # start-up is counted from here
        self.step, self.first_eval, self.train_seconds = 0, None, 0.0
        self.status = M.STATUS_RUNNING
        self.startup_seconds = 0.0
        self.last: dict[str, float] = {}  # latest value of every metric
        self.row_log = RowLog()  # every row reported, carried by checkpoints (trainables.row_log)
        self._rows: list[list] = []  # recorded since the last report
        self._resend: list[list] = []  # after a restore: sent again once with the next report

    # --- counters --------------------------------------------------------------------------------------------
    def counters(self) -> dict[str, float]:
        """Examples are summed over the batch-size stages (`analysis.core.stages`); micro-steps follow from them."""
        cfg, train_size = self.cfg, self.learner.train_size
        examples = cfg.stages.examples(self.step)
        return {
            M.STEP: self.step,
            M.MICRO_STEP: examples // (cfg.batch_size // cfg.accum),  # micro x W is the same in every stage
            M.EXAMPLES: examples,
            M.EPOCH: examples / train_size if train_size else 0.0,
        }

    # --- restore ---------------------------------------------------------------------------------------------
    def restore(self) -> None:
        """Continue from the session's checkpoint, else start a branch from ``init_from``, else start afresh."""
        with self.session.restore() as directory:
            if directory:
                state = self.learner.load(directory)
                self.learner.load_state_dict(state)
                self.step, self.first_eval = state["step"], state["first_eval"]
                self.train_seconds = state["train_seconds"]
                self.last = dict(state.get("last") or {})
                self.row_log.load_state_dict(state.get("row_log"))
                # a finished trial re-run (e.g. by Tune after a driver crash) trains no further; a larger max_steps
                # extends a trial whose budget was spent
                self.status = state.get("status", M.STATUS_RUNNING)
                if self.status == M.STATUS_BUDGET_SPENT and self.step < self.cfg.max_steps:
                    self.status = M.STATUS_RUNNING
            elif self.cfg.init_from:  # a branch: counters start at 0 (trainables.branch_points)
                self.learner.branch_from(self.cfg.init_from)
        self.startup_seconds = CLOCK() - self.started
        self._resend = self.row_log.rows()  # the sweep's watermarks drop the rows it already holds

    def state(self) -> dict:
        """The whole trial state of a checkpoint: the learner's plus the skeleton's."""
        return {
            **self.learner.state_dict(),
            "step": self.step,
            "first_eval": self.first_eval,
            "train_seconds": self.train_seconds,
            "last": dict(self.last),
            "status": self.status,
            "row_log": self.row_log.state_dict(),
        }

    # --- rows, evaluation, reports ---------------------------------------------------------------------------
    def record(self, name: str, value: float) -> None:
        step = self.step
        self._rows.append([step, self.cfg.stages.examples(step), name, float(value), self.train_seconds, time.time()])
        self.last[name] = float(value)

    def evaluate(self) -> str:
        """Evaluate, record the values, and return the verdict (running, reached_target or diverged)."""
        values = self.learner.evaluate()
        for name, value in values.items():
            self.record(name, value)
        loss = values[M.EVAL_LOSS]
        self.first_eval = loss if self.first_eval is None else self.first_eval
        return eval_status(loss, self.first_eval, self.cfg.divergence_factor, self.cfg.target_loss)

    def checkpoint_due(self, final: bool) -> bool:
        """A report carries a checkpoint at the end of the trial and every ``checkpoint_every`` steps."""
        every = self.cfg.checkpoint_every
        return final or bool(every and self.step % every == 0)

    def report(self, save: bool) -> None:
        """Report the rows recorded since the last report; with a checkpoint when ``save``."""
        cfg = self.cfg
        metrics = {
            **self.counters(),
            "status": self.status,
            "train_seconds": self.train_seconds,
            "startup_seconds": self.startup_seconds,
            "worker_pid": os.getpid(),  # which process trained (a restarted worker shows a new pid)
            **self.last,
            "rows": self._resend + self._rows,
        }
        self.row_log.add(self._rows)
        self._resend, self._rows = [], []
        if not save:
            self.session.report(metrics, None)
            return
        with tempfile.TemporaryDirectory(prefix="bcrit-ckpt-") as d:
            self.learner.save(d, self.state)
            keep_checkpoint(cfg.keep_dir, cfg.keep_steps, self.step, d)
            self.session.report(metrics, d)

    # --- the loop --------------------------------------------------------------------------------------------
    def run(self) -> str:
        """Evaluate at step 0, then train until a stop rule fires; returns the final status."""
        if self.status != M.STATUS_RUNNING:  # restored from a final checkpoint: say so once, train nothing
            self.report(save=False)
        elif self.step == 0 and self.first_eval is None:
            self.status = self.evaluate()
            self.report(save=self.checkpoint_due(final=self.status != M.STATUS_RUNNING))
        self.learner.start(self.step, self.train_seconds)
        while self.status == M.STATUS_RUNNING:
            self.advance()
        self.learner.close()
        return self.status

    def sweep_verdict(self) -> str | None:
        """The status the sweep asks this trial to end with (trainables.sweep_signal): ``ended_at_goal``,
        ``stopped_behind``, or None. Rank 0 asks the session's ``sweep_ended`` (a status, or True for
        ``ended_at_goal``), every rank gets its answer (``Learner.agree``). Sessions without ``sweep_ended``, or
        whose reader has no signal's name (a sweep with neither ``goal.running: end`` nor ``stopping.behind``):
        never, and no collective."""
        ask = getattr(self.session, "sweep_ended", None)
        if ask is None or getattr(ask, "name", True) is None:  # no signal to ask (same on every rank): no collective
            return None
        said = ask() if self.session.rank == 0 else None
        code = VERDICTS.index(M.STATUS_ENDED if said is True else said if said in VERDICTS else None)
        return VERDICTS[self.learner.agree(code)]

    def advance(self) -> None:
        """One optimizer step: record its values, evaluate on the schedule, report on the report interval."""
        cfg = self.cfg
        outcome = self.learner.step(self.step)
        self.step += 1
        self.train_seconds += outcome.seconds
        for name, value in outcome.values.items():
            self.record(name, value)
        if outcome.finite:
            self.status = status_after_step(self.step, cfg.eval_every, cfg.max_steps, self.evaluate)
        else:
            self.status = M.STATUS_DIVERGED
        if self.status == M.STATUS_RUNNING and self.step % cfg.eval_every == 0:
            self.status = self.sweep_verdict() or self.status
        final = self.status != M.STATUS_RUNNING
        if final or self.step % cfg.report_interval == 0:
            self.train_seconds += self.learner.flush()
            for name, value in self.learner.interval(self.step, self.train_seconds).items():
                self.record(name, value)
            self.report(save=self.checkpoint_due(final))
