"""A sweep's word to its running trials: the adaptive sweep's goal is met, end now; or this trial is behind, stop.

A trial ends itself (trainables.stopping: a trial Tune stops leaks its placement group; docs/design.md), so an
adaptive sweep that stops on its goal with trials still running (analysis.features.adaptive.next_trials,
``end_pending``)
tells them through a named Ray actor, `GoalSignal`, that its driver owns (it dies with the driver: a resumed sweep
starts with a new one). A trial's rank 0 asks it at every evaluation (`SignalReader`; a trial of a sweep without
one, or outside Ray, never asks), every rank agrees on the answer (``Learner.agree``), and the trial ends with the
status ``ended_at_goal`` after a final report and checkpoint. The actor's name (`signal_name`) follows from the
sweep's directory, so the driver's searcher and the trials find it without passing a handle through the configs.

The same actor carries ``stopping.behind``'s word to single trials (`mark_behind`, from the driver's
`orchestrator.features.stop_behind.behind_callback.StopBehind` callback): a trial it names, asking with its Tune trial
id, ends with the status ``stopped_behind`` (analysis.features.stop_behind.stop_behind).
"""

from __future__ import annotations

import functools
import hashlib
import os
import time

SIGNAL_KEY = "sweep_signal"  # key of the actor's name in a Train run's train_loop_config
TRIAL_KEY = "tune_trial_id"  # key of the Tune trial's id there: what a trial is named by when it is stopped alone
ASK_TIMEOUT_S = 30.0
LOOKUP_EVERY_S = 2.0  # a trial's retry of a failed lookup of its sweep's actor (SignalReader)
_HELD: dict = {}  # name -> the handle of a GoalSignal this process created


def signal_name(sweep_dir: str) -> str:
    """``bcrit-goal-<12 hex>``: the named actor of the sweep whose directory (or storage URI) is ``sweep_dir``."""
    where = sweep_dir if "://" in sweep_dir else os.path.abspath(sweep_dir)
    return "bcrit-goal-" + hashlib.sha1(where.encode()).hexdigest()[:12]


@functools.cache
def _actor_class():
    import ray

    @ray.remote(num_cpus=0)
    class GoalSignal:
        """Holds whether the sweep has asked its running trials to end, and which trials it stopped alone."""

        def __init__(self):
            self._ended = False
            self._behind: set[str] = set()

        def behind(self, trial_ids: list[str]) -> None:
            self._behind.update(trial_ids)

        def verdict(self, trial_id: str | None) -> str | None:
            """``ended_at_goal``, ``stopped_behind`` (this trial), or None: train on."""
            if self._ended:
                return "ended_at_goal"
            return "stopped_behind" if trial_id in self._behind else None

        def end(self) -> None:
            self._ended = True

        def reset(self) -> None:
            self._ended = False

    return GoalSignal


def _tell(name: str, call) -> None:
    """Create (or find) the sweep's signal actor, owned by this process, and ``call(actor)`` on it."""
    import ray

    for fresh in (False, True):  # a handle held from an earlier Ray of this process is stale: create anew
        actor = None if fresh else _HELD.get(name)
        actor = actor or _actor_class().options(name=name, get_if_exists=True).remote()
        _HELD[name] = actor  # a named actor lives while a handle does (not detached): this driver holds it
        try:
            ray.get(call(actor), timeout=ASK_TIMEOUT_S)
            return
        except ray.exceptions.RayError:
            if fresh:
                raise


def set_signal(name: str, ended: bool) -> None:
    """Create (or find) the sweep's signal actor, owned by this process, and set it. Call from the driver."""
    _tell(name, lambda a: a.end.remote() if ended else a.reset.remote())


def open_signal(name: str) -> None:
    """Create the sweep's signal actor now, owned by this process (the driver), unset: the trials' asks then find it
    from their first evaluation instead of each failing a lookup until the first word."""
    _tell(name, lambda a: a.verdict.remote(None))


def mark_behind(name: str, trial_ids: list[str]) -> None:
    """Tell the trials ``trial_ids`` (Tune trial ids) to stop with the status ``stopped_behind``. From the driver."""
    _tell(name, lambda a: a.behind.remote(list(trial_ids)))


class SignalReader:
    """``reader()``: the status the sweep named ``name`` asks this trial (Tune id ``trial_id``) to end with:
    ``ended_at_goal`` (every trial), ``stopped_behind`` (this one), or None -- also without a name, before the
    driver creates the actor, or when it cannot be reached: a trial is never ended by a failed lookup.

    It never waits on the actor after its first answer: each call takes the answer of the previous ask if it has
    come (``ray.wait`` with no timeout) and sends the next, so a word reaches the trial one evaluation later than a
    blocking ask would, and an evaluation pays for sending a call, not for its round trip (a blocking ask's round
    trip was a visible share of a dense trial's evaluation time). A failed lookup (no actor yet) is retried at
    most every ``LOOKUP_EVERY_S`` seconds."""

    def __init__(self, name: str | None, trial_id: str | None = None):
        self.name, self.trial_id = name, trial_id
        self._actor = self._pending = self._answer = None
        self._retry_at = -float("inf")

    def __call__(self) -> str | None:
        if not self.name or self._answer:
            return self._answer
        import ray

        try:
            if self._actor is None:
                if time.monotonic() < self._retry_at:
                    return None
                self._retry_at = time.monotonic() + LOOKUP_EVERY_S
                self._actor = ray.get_actor(self.name)
                self._answer = ray.get(self._actor.verdict.remote(self.trial_id), timeout=ASK_TIMEOUT_S)
            elif ray.wait([self._pending], timeout=0)[0]:
                self._answer = ray.get(self._pending)
            else:
                return None
            if not self._answer:
                self._pending = self._actor.verdict.remote(self.trial_id)
            return self._answer
        except Exception:  # not created yet (ValueError), or gone with its driver: keep training
            self._actor = self._pending = None
            return None
