"""Optuna (TPE) search of the nuisance hyper-parameters, re-tuned separately for every group of a sweep.

OptunaSearch refuses ``grid_search`` in the param space (REFERENCE.md), and one study over all batch sizes would
mix the scientific variable into the nuisance search. `GroupedOptunaSearch` therefore holds one ``OptunaSearch``
per group of ``SweepSpec.groups()`` (batch size x split x seed) and issues exactly ``trials_per_batch_size``
trials to each, round-robin over the groups with quota left (so every batch size's study gets feedback at the same
pace), then ``Searcher.FINISHED``. A suggestion is the group's fixed trial config with the sampled values merged
in, under the ``"trial"`` key the trainable reads. Results are routed back to the group's study by trial id; the
value minimised is the trainable's ``objective`` (steps to target; censored and diverged trials ranked behind).

Ranges (spec ``nuisance.<name>: {low, high}``): ``lr`` and ``weight_decay`` log-uniform, ``beta2`` uniform,
``warmup_steps`` uniform integer (both ends included). Every group's TPE sampler gets the spec's
``nuisance.seed``, so the random start-up points coincide across groups (paired comparisons between batch sizes).
``save``/``restore`` pickle the whole state (studies, sampler RNGs, quotas issued, trial -> group), which Tune
writes with its experiment checkpoint. That file and Tune's trial list (``experiment_state-*.json``) are uploaded
from the driver's staging directory one after the other by a background syncer, so a driver killed mid-upload can
leave a searcher state older (or newer) than the trial list Tune restores: after restoring, the quotas are
therefore recounted from the trials Tune actually restores (`reconcile`). ``Tuner.restore`` thus neither re-issues
nor loses trials; a restored trial that the restored study never saw is told to it when it completes
(``add_evaluated_point``), and one the study saw but Tune lost is simply never completed.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

from ray.tune.result import TRAINING_ITERATION
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from orchestrator.tune_trainable import OBJECTIVE

LOG_SCALE = ("lr", "weight_decay")
INT_PARAMS = ("warmup_steps",)


def distributions(space: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Optuna distributions of the spec's ranges ``name -> (low, high)``."""
    import optuna

    out: dict[str, Any] = {}
    for name, (low, high) in space.items():
        if name in INT_PARAMS:
            out[name] = optuna.distributions.IntDistribution(int(low), int(high))
        else:
            out[name] = optuna.distributions.FloatDistribution(float(low), float(high), log=name in LOG_SCALE)
    return out


def startup_trials(trials_per_group: int) -> int:
    """Random trials before TPE models the group (Optuna's default 10 would make a small quota pure random)."""
    return max(2, min(10, trials_per_group // 2))


class GroupedOptunaSearch(Searcher):
    """One TPE study per group; ``groups[i]`` is group i's fixed trial config (nuisance constants included)."""

    def __init__(
        self,
        groups: list[dict[str, Any]],
        space: dict[str, tuple[float, float]],
        trials_per_group: int,
        seed: int = 0,
        metric: str = OBJECTIVE,
        mode: str = "min",
    ):
        super().__init__(metric=metric, mode=mode)
        if not groups or not space or trials_per_group < 1:
            raise ValueError("GroupedOptunaSearch needs groups, a non-empty space and trials_per_group >= 1")
        self._groups = [dict(g) for g in groups]
        self._space = dict(space)
        self._quota = trials_per_group
        self._seed = seed
        self._searchers: list[OptunaSearch] | None = None  # built at the first suggestion (metric/mode final)
        self._issued = [0] * len(groups)
        self._next = 0  # round-robin position
        self._group_of: dict[str, int] = {}  # trial id -> group index
        self._adopted: dict[str, dict] = {}  # restored trial unknown to its study -> its sampled params

    @classmethod
    def from_spec(cls, spec) -> GroupedOptunaSearch:
        """The searcher of an optuna ``SweepSpec``: ranges searched, constants fixed in every group."""
        space = {k: v for k, v in spec.nuisance.items() if isinstance(v, tuple)}
        constants = {k: v for k, v in spec.nuisance.items() if not isinstance(v, tuple)}
        groups = [{**spec.base_config(b, s, seed), **constants} for b, s, seed in spec.groups()]
        return cls(groups, space, spec.trials_per_batch_size, spec.search_seed)

    @property
    def total_trials(self) -> int:
        return len(self._groups) * self._quota

    def issued(self) -> list[int]:
        """Trials suggested so far, per group."""
        return list(self._issued)

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        if self._searchers is not None:
            return False  # the studies exist: their direction can no longer change
        self._metric = metric or self._metric
        self._mode = mode or self._mode
        return True

    def _build(self) -> list[OptunaSearch]:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # one "study created" line per group is noise
        dists = distributions(self._space)
        return [
            OptunaSearch(
                space=dists,
                metric=self._metric,
                mode=self._mode,
                sampler=optuna.samplers.TPESampler(seed=self._seed, n_startup_trials=startup_trials(self._quota)),
            )
            for _ in self._groups
        ]

    def suggest(self, trial_id: str) -> dict | str | None:
        if self._searchers is None:
            self._searchers = self._build()
        n = len(self._groups)
        for k in range(n):
            i = (self._next + k) % n
            if self._issued[i] < self._quota:
                break
        else:
            return Searcher.FINISHED
        self._next = (i + 1) % n
        self._issued[i] += 1
        self._group_of[trial_id] = i
        params = self._searchers[i].suggest(trial_id)
        return {"trial": {**self._groups[i], **params}}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        i = self._group_of.get(trial_id)
        if i is not None and trial_id not in self._adopted and self.metric in result and TRAINING_ITERATION in result:
            self._searchers[i].on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        i = self._group_of.get(trial_id)
        if i is None:
            return
        params = self._adopted.pop(trial_id, None)
        if params is None:
            self._searchers[i].on_trial_complete(trial_id, result=result, error=error)
        elif result and self.metric in result and not error:  # a restored trial this study never suggested
            self._searchers[i].add_evaluated_point(params, result[self.metric])

    def group_index(self, trial_config: dict) -> int | None:
        """The group whose fixed config a trial's ``config["trial"]`` carries (``None``: not one of this sweep)."""
        norm = json.loads(json.dumps(trial_config, default=str))
        for i, g in enumerate(self._groups):
            if all(k in norm and norm[k] == v for k, v in json.loads(json.dumps(g, default=str)).items()):
                return i
        return None

    def reconcile(self, trials: dict[str, dict]) -> None:
        """Recount the quotas from the trials Tune restores (trial id -> config): a group's issued count is the
        number of its trials Tune knows, whatever the (possibly older or newer) searcher state said."""
        if self._searchers is None:
            self._searchers = self._build()
        known = dict(self._group_of)
        self._issued, self._group_of, self._adopted = [0] * len(self._groups), {}, {}
        for trial_id, config in trials.items():
            i = self.group_index(config.get("trial", {}))
            if i is None:
                continue
            self._issued[i] += 1
            self._group_of[trial_id] = i
            if known.get(trial_id) != i:
                self._adopted[trial_id] = {k: config["trial"][k] for k in self._space if k in config["trial"]}

    def restore_from_dir(self, checkpoint_dir: str) -> None:
        super().restore_from_dir(checkpoint_dir)
        trials = tune_trials(checkpoint_dir)
        if trials is not None:
            self.reconcile(trials)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__.copy(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        if state["_groups"] != self._groups or state["_space"] != self._space or state["_quota"] != self._quota:
            raise ValueError(f"{checkpoint_path}: searcher state of another sweep spec (groups, ranges or quota)")
        self.__dict__.update(state)


def tune_trials(experiment_dir: str) -> dict[str, dict] | None:
    """Trial id -> config of the trials in Tune's newest experiment state in ``experiment_dir`` (the ones
    ``Tuner.restore`` re-creates); ``None`` when there is none. Reads Tune's own file with Tune's own loaders."""
    from ray.tune.execution.experiment_state import _find_newest_experiment_checkpoint
    from ray.tune.utils.serialization import _loads_with_cloudpickle

    path = _find_newest_experiment_checkpoint(experiment_dir)
    if path is None:
        return None
    with open(path) as f:
        state = _loads_with_cloudpickle(f.read())
    out = {}
    for trial_json, _meta in state.get("trial_data", []):
        t = _loads_with_cloudpickle(trial_json)
        out[t["trial_id"]] = t.get("config", {})
    return out
