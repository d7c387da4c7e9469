"""``nuisance.search: adaptive``: a Tune ``Searcher`` that spends trials where the B_crit interval needs them.

The decision rule is the analysis's (:func:`analysis.features.adaptive.next_trials.next_trials`, docs/sweeps.md
"Adaptive
search"); this module feeds it: at each refit (when a trial has finished since the last one, or the queue is empty)
it reads the sweep's own tables (finished trials only), passes the trials suggested but not finished as pending, and
asks for as many trials as the sweep runs at once, queued and handed out one per ``suggest``. When the rule says stop
(``goal_met``, ``budget_trials``, ``budget_examples``, ``space_exhausted``) ``suggest`` returns ``Searcher.FINISHED``.
Every refit and every trial handed out is written to `DECISIONS_FILE` (JSON, atomic replace), which the progress line,
MLflow's ``adaptive/rel_ci`` and ``bcrit analyze``'s report read. **State as data**: ``save``/``restore`` hold JSON only
(the trials handed out, the queue, the refit count, the stop reason). After a restore `reconcile` squares them with the
trials Tune restores: one Tune restores that this state never handed out is adopted; one Tune lost counts as finished
when the tables hold its final row, else it was lost while running, its records are removed
(orchestrator.records.lost_trials) and its setting is handed out again first (listed under ``lost``). The goal and
budget are the spec's, not the saved ones."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pyarrow as pa
import ray
from ray.tune.search import Searcher

from analysis.core import metrics as M
from analysis.features.adaptive import next_trials as nt
from analysis.sources.loaders import RunsTableError, load_sweep_dir, runs_from_tables, subset_tables
from orchestrator.records.runs_tables import RunsTables
from orchestrator.search.optuna_search import OBJECTIVE, read_state, tune_trials
from orchestrator.storage.layout import DECISIONS_FILE  # every refit and every trial handed out
from trainables.sweep_signal import set_signal, signal_name

STATE_FORMAT = "bcrit-adaptive-search/1"
DECISION_BOOTSTRAP = nt.CONFIRM_BOOTSTRAP  # resamples of each refit: bcrit analyze's 1000 (next_trials docstring)


class AdaptiveSearch(Searcher):
    """The adaptive sweep's searcher. ``configs[b]``: the trial config of batch size b without ``lr`` and
    ``seed``; ``seeds``: the seed values a setting may get (a trial's seed index picks one)."""

    def __init__(
        self,
        space: nt.Space,
        goal: nt.Goal,
        budget: nt.Budget,
        configs: dict[int, dict[str, Any]],
        seeds: tuple[int, ...],
        sweep_dir: str,
        seed: int = 0,
        bootstrap: int = DECISION_BOOTSTRAP,
        end_running: bool = False,
        hold: bool = True,
    ):
        super().__init__(metric=OBJECTIVE, mode="min")
        self.space, self.goal, self.budget = space, goal, budget
        self._configs = {int(b): dict(c) for b, c in configs.items()}
        self._seeds = tuple(int(s) for s in seeds)
        self.sweep_dir = sweep_dir
        self._seed, self._bootstrap = seed, bootstrap
        self._batch = 1  # trials chosen per refit: the sweep's concurrency (set_max_concurrency)
        self._issued: dict[str, list] = {}  # trial id -> [batch size, lr, seed index, kind, reason]
        self._queue: list[dict] = []  # chosen, not yet handed out
        self._seen_done: list[str] = []  # finished trial ids at the last refit
        self._refits: list[dict] = []  # every refit's record (DECISIONS_FILE)
        self._stop: str | None = None
        self._completed: set[str] = set()  # trial ids Tune reported complete
        self._lost: list[dict] = []  # trials handed out, lost with a killed driver and handed out again
        self._end_running = end_running  # goal.running: end (a goal met ends the running trials), else wait
        self._signal_synced = not end_running  # this driver's GoalSignal set from the state (one per driver)
        self._hold = hold  # goal.hold: no new trial while the running ones are expected to meet the goal

    @classmethod
    def from_spec(cls, spec) -> AdaptiveSearch:
        a = spec.adaptive
        split = {b: spec.splits[b][0] for b in spec.batch_sizes}
        constants = {k: v[0] for k, v in spec.nuisance.items() if k != "lr"}
        configs = {}
        for b in spec.batch_sizes:
            c = {**spec.base_config(b, split[b], spec.seeds[0]), **constants}
            c.pop("seed")
            configs[b] = c
        space = nt.Space(tuple(spec.batch_sizes), tuple(spec.nuisance["lr"]), max_seeds=len(spec.seeds))
        goal = nt.Goal(a.targets, a.rel_ci, a.min_seeds, bins=a.bins)
        budget = nt.Budget(a.budget_examples, a.budget_trials)
        return cls(space, goal, budget, configs, spec.seeds, spec.sweep_dir, seed=spec.search_seed,
                   end_running=a.end_running, hold=a.hold)  # fmt: skip

    # --- Tune's interface ---------------------------------------------------------------------------------
    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self._batch = max(1, int(max_concurrent))
        return False  # Tune's ConcurrencyLimiter still caps the running trials

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        return True  # the objective is fixed: the B_crit interval, not a metric to optimise

    def suggest(self, trial_id: str) -> dict | str | None:
        if not self._signal_synced:
            self._signal(self._stop == nt.GOAL_MET)  # a resumed sweep stopped on its goal ends what Tune resumes
        if self._stop is not None:
            return Searcher.FINISHED
        done = self.finished_ids()
        if done != self._seen_done or not self._queue:
            if done == self._seen_done and self._refits and not self._refits[-1]["choices"] and self.pending():
                return None  # nothing finished since the rule said wait: the answer cannot have changed
            self._refit(done)
        if self._stop is not None:
            return Searcher.FINISHED
        if not self._queue:
            return None  # wait for a pending trial (the goal may be met, or the budget filled by pending trials)
        c = self._queue.pop(0)
        self._issued[trial_id] = [c["batch_size"], c["lr"], c["seed"], c["kind"], c["reason"]]
        self._write()
        return {"trial": self.trial_config(nt.Trial(c["batch_size"], c["lr"], c["seed"]))}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        # its rows are read from the sweep's tables at the next refit; it is no longer pending even if the tables
        # never got its final status (so the sweep cannot wait for a trial Tune has ended)
        self._completed.add(trial_id)

    def trial_config(self, t: nt.Trial) -> dict[str, Any]:
        return {**self._configs[t.batch_size], "lr": t.lr, "seed": self._seeds[t.seed]}

    # --- what the rule sees ----------------------------------------------------------------------------------
    def _table_runs(self):
        try:
            return load_sweep_dir(self.sweep_dir)
        except RunsTableError:
            return None  # no table yet: nothing has run

    def finished_ids(self) -> list[str]:
        """Trial ids whose final status the sweep's tables hold (sorted)."""
        runs = self._table_runs()
        if runs is None:
            return []
        final = np.isin(runs.status, M.FINAL_STATUSES)
        return sorted(t for t, f in zip(runs.trial_ids, final, strict=True) if f)

    def finished_runs(self, done: list[str]):
        """The finished trials as analysis ``Runs``, their ``seed`` the seed index the rule counts in."""
        runs = self._table_runs()
        if runs is None or not done:
            return None
        trials, metrics = subset_tables(runs, done)
        i = trials.schema.get_field_index("seed")
        index = [self._seeds.index(int(s)) if int(s) in self._seeds else int(s) for s in trials.column(i).to_pylist()]
        trials = trials.set_column(i, trials.schema.field(i), pa.array(index, trials.schema.field(i).type))
        return runs_from_tables(trials, metrics, source=runs.source)

    def pending(self, done: list[str] | None = None) -> list[nt.Trial]:
        """Trials handed out, neither finished in the tables nor reported complete by Tune."""
        return [nt.Trial(int(v[0]), float(v[1]), int(v[2])) for v in map(self._issued.get, self.pending_ids(done))]

    def pending_ids(self, done: list[str] | None = None) -> list[str]:
        """The ids of the trials `pending` lists, in the order they were handed out."""
        done = set(self.finished_ids() if done is None else done) | self._completed
        return [t for t in self._issued if t not in done]

    def _signal(self, ended: bool) -> None:
        """Set this sweep's `trainables.sweep_signal.GoalSignal` (owned by this driver; ``goal.running: end``):
        ``ended`` asks the running trials to end. Without Ray (the searcher driven directly, e.g. in tests): nothing
        to tell."""
        if not ray.is_initialized():
            return
        set_signal(signal_name(self.sweep_dir), ended)
        self._signal_synced = True

    def _refit(self, done: list[str]) -> None:
        pending = self.pending(done)
        dec = nt.next_trials(
            self.finished_runs(done), self.space, self.goal, self.budget, pending, n=self._batch,
            bootstrap=self._bootstrap, seed=self._seed, end_pending=self._end_running, hold=self._hold,
        )  # fmt: skip
        self._seen_done = list(done)
        self._stop = dec.stop
        ended = self.pending_ids(done) if dec.stop == nt.GOAL_MET else []
        if ended:  # the goal is met on the finished trials: the running ones end at their next evaluation
            self._signal(True)
        label, width = dec.widest()
        self._queue = [
            {"batch_size": c.trial.batch_size, "lr": c.trial.lr, "seed": c.trial.seed, "kind": c.kind,
             "reason": c.reason, "score": _finite(c.score), "examples": _finite(c.examples)}
            for c in dec.choices
        ]  # fmt: skip
        self._refits.append(
            {
                "refit": len(self._refits) + 1,
                "trials_finished": dec.trials_spent,
                "trials_pending": len(pending),
                "examples_spent": dec.examples_spent,
                "widths": {f"{t:g}": _finite(w) for t, w in dec.widths.items()},
                "b_crit": {f"{f['target']:g}": _finite(f["b_crit"]) for f in dec.fits},
                "flags": {f"{f['target']:g}": list(f["flags"]) for f in dec.fits},  # the analysis's, per goal target
                "widest": {"what": label, "width": _finite(width)},  # global targets and counted bins
                "bins": [b.record() for b in dec.bins],  # goal.bins only
                "choices": [dict(c) for c in self._queue],
                "stop": dec.stop,
                "ending": ended,  # at a stop on the goal: the trials still running, asked to end
                "confirmed": dec.confirmed,  # resamples of a refit that re-checked a goal met (else null)
                "holding": dec.holding,  # no trial chosen: the running ones are expected to meet the goal
            }
        )
        self._write()

    # --- records ----------------------------------------------------------------------------------------------
    def decisions(self) -> dict:
        """What DECISIONS_FILE holds: the goal, the budget, every refit, every trial handed out, the stop."""
        return {
            "format": STATE_FORMAT,
            "goal": {
                "rel_ci": self.goal.rel_ci,
                "targets": list(self.goal.targets),
                "min_seeds": self.goal.min_seeds,
                "bins": self.goal.bins,
            },  # fmt: skip
            "budget": {"examples": self.budget.examples, "trials": self.budget.trials},
            "seeds": list(self._seeds),
            "stop": self._stop,
            "refits": self._refits,
            "issued": [
                {"trial_id": t, "batch_size": v[0], "lr": v[1], "seed": self._seeds[v[2]], "kind": v[3], "reason": v[4]}
                for t, v in self._issued.items()
            ],  # fmt: skip
            "lost": [{**t, "seed": self._seeds[t["seed"]]} for t in self._lost],
        }

    def _write(self) -> None:
        os.makedirs(self.sweep_dir, exist_ok=True)
        path = os.path.join(self.sweep_dir, DECISIONS_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(self.decisions(), f, indent=1)
        os.replace(path + ".tmp", path)

    # --- state as data ----------------------------------------------------------------------------------------
    def _fingerprint(self) -> dict:
        return {"batch_sizes": list(self.space.batch_sizes), "lrs": list(self.space.lrs), "seeds": list(self._seeds)}

    def state(self) -> dict:
        return {
            "format": STATE_FORMAT,
            **self._fingerprint(),
            "issued": self._issued,
            "queue": self._queue,
            "seen_done": self._seen_done,
            "refits": self._refits,
            "stop": self._stop,
            "completed": sorted(self._completed),
            "lost": self._lost,
            "batch": self._batch,
            "goal": goal_key(self.goal, self._end_running),
            "budget": [self.budget.examples, self.budget.trials],
        }

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "w") as f:
            json.dump(self.state(), f)

    def restore(self, checkpoint_path: str) -> None:
        """Read what `save` wrote (JSON only). A goal or budget changed since (``--resume --set``) re-opens a
        stopped search and drops the queue, which was chosen for the old goal."""
        state = read_state(checkpoint_path, STATE_FORMAT)
        if state is None:
            raise ValueError(f"{checkpoint_path}: not a bcrit adaptive searcher state (JSON, {STATE_FORMAT})")
        if {k: state[k] for k in self._fingerprint()} != self._fingerprint():
            raise ValueError(f"{checkpoint_path}: searcher state of another sweep spec (batch sizes, lrs or seeds)")
        self._issued = {k: list(v) for k, v in state["issued"].items()}
        self._queue, self._seen_done = list(state["queue"]), list(state["seen_done"])
        self._refits, self._stop, self._batch = list(state["refits"]), state["stop"], int(state["batch"])
        self._completed = set(state["completed"])
        self._lost = [dict(t) for t in state.get("lost", [])]
        now = (goal_key(self.goal, self._end_running), [self.budget.examples, self.budget.trials])
        changed = now != (state["goal"], state["budget"])
        if changed:
            self._stop, self._queue, self._seen_done = None, [], []
        trials = tune_trials(os.path.dirname(os.path.abspath(checkpoint_path)))
        if trials is not None:
            self.reconcile(trials, again=not changed)

    def reconcile(self, trials: dict[str, dict], again: bool = True) -> None:
        """Match the trials handed out with those Tune restores (trial id -> config). Tune's trials this state
        never handed out count as handed out. A trial handed out that Tune lost counts as finished when the tables
        hold its final row, as ended when Tune reported it complete; otherwise it was lost while running: it is no
        longer handed out (so not pending: the rule neither waits for it nor counts it against the budget) and,
        when ``again`` (the queue was chosen for this goal), its setting is queued first to be handed out again."""
        done, parts = set(self.finished_ids()) | self._completed, RunsTables(self.sweep_dir)
        # a final row still in its part (killed before the compaction): ended too, as
        # orchestrator.records.lost_trials sees it
        lost = [
            t
            for t in self._issued
            if t not in trials and t not in done and parts.trial_status(t) not in M.FINAL_STATUSES
        ]
        back = []
        for t in lost:
            b, lr, seed, kind, reason = self._issued.pop(t)
            self._lost.append({"trial_id": t, "batch_size": b, "lr": lr, "seed": seed, "kind": kind, "reason": reason})
            back.append({"batch_size": b, "lr": lr, "seed": seed, "kind": kind, "reason": reason, "score": None,
                         "examples": None})  # fmt: skip
        if again:
            self._queue = back + self._queue
        for trial_id, config in trials.items():
            c = config.get("trial", {})
            if trial_id in self._issued or "batch_size" not in c or c.get("seed") not in self._seeds:
                continue
            self._issued[trial_id] = [int(c["batch_size"]), float(c["lr"]), self._seeds.index(c["seed"]), "", ""]


def goal_key(goal: nt.Goal, end_running: bool = False) -> list:
    """The goal as saved state: ``[rel_ci, targets, min_seeds]``, ``+ [True]`` with ``bins``, ``+ ["end"]`` with
    ``running: end`` (a state saved before either existed reads as ``bins: false``, ``running: wait``)."""
    return (
        [goal.rel_ci, list(goal.targets), goal.min_seeds]
        + ([True] if goal.bins else [])
        + (["end"] if end_running else [])
    )


def _finite(x: float) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None
