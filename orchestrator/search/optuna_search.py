"""Optuna (TPE) search of the nuisance hyper-parameters, re-tuned separately for every group of a sweep.

OptunaSearch refuses ``grid_search`` in the param space, and one study over all batch sizes would mix the scientific
variable into the nuisance search (docs/design.md). `GroupedOptunaSearch` therefore holds one ``OptunaSearch`` per
group of ``SweepSpec.groups()`` (batch size x split x seed) and issues exactly ``trials_per_batch_size`` trials to
each, round-robin over the groups with quota left, then ``Searcher.FINISHED``. A suggestion is the group's fixed
trial config with the sampled values merged in, under the ``"trial"`` key the trainable reads; results go back to
the group's study by trial id; the value minimised is the trainable's ``objective`` (steps to target; censored and
diverged trials ranked behind). Ranges (``nuisance.<name>: {low, high}``): ``lr`` and ``weight_decay`` log-uniform,
``beta2`` uniform, ``warmup_steps`` uniform integer; every group's sampler gets ``nuisance.seed``. **Search state as
data** (docs/security.md): the studies live in Optuna's journal file `SEARCH_FILE` in the sweep directory, each
suggestion's TPE sampler is seeded from ``(nuisance.seed, the trial's number in its study)``, and ``save``/``restore``
hold JSON only (``restore`` refuses anything else); after a restore `reconcile` recounts the quotas from the trials Tune
restores, so a resume neither re-issues nor loses trials (docs/design.md)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import numpy as np
from ray.tune.execution.experiment_state import _find_newest_experiment_checkpoint
from ray.tune.result import TRAINING_ITERATION
from ray.tune.search import Searcher
from ray.tune.utils.serialization import _loads_with_cloudpickle

from orchestrator.storage.layout import SEARCH_FILE

OBJECTIVE = "objective"  # what the searcher minimises (orchestrator.execution.tune_trainable.objective)
TUNE_ID = "tune_trial_id"  # user attribute of an Optuna trial: the Tune trial it was suggested for
STATE_FORMAT = "bcrit-grouped-optuna-search/2"  # the JSON searcher state (format 1 was a pickle)
logger = logging.getLogger(__name__)

LOG_SCALE = ("lr", "weight_decay")
INT_PARAMS = ("warmup_steps",)


def distributions(space: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Optuna distributions of the spec's ranges ``name -> (low, high)``."""
    # Optuna: deferred, importing optuna_search loads no Optuna
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


def read_state(path: str, fmt: str) -> dict | None:
    """A searcher's state as its ``save`` wrote it: a JSON object whose ``"format"`` is ``fmt``; None for any other
    file (never unpickled)."""
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (ValueError, UnicodeDecodeError):
        return None
    return state if isinstance(state, dict) and state.get("format") == fmt else None


class GroupedOptunaSearch(Searcher):
    """One TPE study per group; ``groups[i]`` is group i's fixed trial config (nuisance constants included).
    ``storage_path``: the journal file holding the studies (None: in memory, for tests and tools)."""

    def __init__(
        self,
        groups: list[dict[str, Any]],
        space: dict[str, tuple[float, float]],
        trials_per_group: int,
        seed: int = 0,
        metric: str = OBJECTIVE,
        mode: str = "min",
        storage_path: str | None = None,
    ):
        super().__init__(metric=metric, mode=mode)
        if not groups or not space or trials_per_group < 1:
            raise ValueError("GroupedOptunaSearch needs groups, a non-empty space and trials_per_group >= 1")
        self._groups = [dict(g) for g in groups]
        self._space = dict(space)
        self._quota = trials_per_group
        self._seed = seed
        self._storage_path = storage_path
        self._studies: list | None = None  # built at the first suggestion (metric/mode final), from the storage
        self._open: dict[str, Any] = {}  # trial id -> its running optuna Trial
        self._told: dict[str, int] = {}  # trial id whose result the storage holds already -> its group
        self._issued = [0] * len(groups)
        self._next = 0  # round-robin position
        self._group_of: dict[str, int] = {}  # trial id -> group index
        self._adopted: dict[str, dict] = {}  # restored trial unknown to its study -> its sampled params

    @classmethod
    def from_spec(cls, spec) -> GroupedOptunaSearch:
        """The searcher of an optuna ``SweepSpec``: ranges searched, constants fixed in every group; the studies
        in `SEARCH_FILE` of the sweep directory."""
        space = {k: v for k, v in spec.nuisance.items() if isinstance(v, tuple)}
        constants = {k: v for k, v in spec.nuisance.items() if not isinstance(v, tuple)}
        groups = [{**spec.base_config(b, s, seed), **constants} for b, s, seed in spec.groups()]
        path = os.path.join(spec.sweep_dir, SEARCH_FILE)
        return cls(groups, space, spec.trials_per_batch_size, spec.search_seed, storage_path=path)

    def __getstate__(self) -> dict:
        """What Tune pickles into ``tuner.pkl``: the configuration, never open studies (they live in the storage)."""
        return {**self.__dict__, "_studies": None, "_open": {}, "_told": {}}

    @property
    def total_trials(self) -> int:
        return len(self._groups) * self._quota

    def studies(self) -> list:
        """The groups' Optuna studies (built on first use)."""
        if self._studies is None:
            self._studies = self._build()
        return self._studies

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        if self._studies is not None:
            return False  # the studies exist: their direction can no longer change
        self._metric = metric or self._metric
        self._mode = mode or self._mode
        return True

    def _build(self) -> list:
        """Every group's study, created or loaded from the storage; its running trials found again by Tune id."""
        # Optuna: deferred, importing optuna_search loads no Optuna
        import optuna
        from optuna.storages import InMemoryStorage, JournalStorage
        from optuna.storages.journal import JournalFileBackend

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # one "study created" line per group is noise
        if self._storage_path:
            os.makedirs(os.path.dirname(os.path.abspath(self._storage_path)), exist_ok=True)
            storage = JournalStorage(JournalFileBackend(self._storage_path))
        else:
            storage = InMemoryStorage()
        direction = "minimize" if self._mode == "min" else "maximize"
        studies = []
        for i in range(len(self._groups)):
            name = f"group-{i}"
            study = optuna.create_study(
                storage=storage, study_name=name, direction=direction, pruner=optuna.pruners.NopPruner(),
                sampler=self._sampler(0), load_if_exists=True,
            )  # fmt: skip
            study_id = storage.get_study_id_from_name(name)
            for t in study.get_trials(deepcopy=False):
                tune_id = t.user_attrs.get(TUNE_ID)
                if tune_id is None:
                    continue
                if t.state == optuna.trial.TrialState.RUNNING:
                    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
                    self._open[tune_id] = optuna.trial.Trial(study, trial_id)
                else:
                    self._told[tune_id] = i
            studies.append(study)
        return studies

    def _sampler(self, number: int):
        """The TPE sampler of the study's trial ``number``: seeded from (seed, number), so a suggestion depends on
        the seed and the stored history only. The same seed in every group: random start-up points coincide."""
        # Optuna: deferred, importing optuna_search loads no Optuna
        import optuna

        seed = int(np.random.SeedSequence([self._seed, number]).generate_state(1)[0])
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials(self._quota))

    def suggest(self, trial_id: str) -> dict | str | None:
        studies = self.studies()
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
        study = studies[i]
        study.sampler = self._sampler(len(study.get_trials(deepcopy=False)))
        trial = study.ask(fixed_distributions=distributions(self._space))
        trial.set_user_attr(TUNE_ID, trial_id)
        self._open[trial_id] = trial
        return {"trial": {**self._groups[i], **trial.params}}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.studies()  # a restored searcher finds its running trials there
        trial = self._open.get(trial_id)
        if trial is not None and self.metric in result and TRAINING_ITERATION in result:
            trial.report(result[self.metric], result[TRAINING_ITERATION])

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        # Optuna: deferred, importing optuna_search loads no Optuna
        import optuna

        i = self._group_of.get(trial_id)
        if i is None:
            return
        self.studies()
        value = (result or {}).get(self.metric)
        params = self._adopted.pop(trial_id, None)
        trial = self._open.pop(trial_id, None)
        State = optuna.trial.TrialState
        state = State.COMPLETE if value is not None else State.FAIL if error else State.PRUNED
        if params is not None:  # a restored trial this study never suggested
            if state == State.COMPLETE and not error:
                dists = distributions(self._space)
                self.studies()[i].add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value))
        elif trial is not None and trial_id not in self._told:
            self._told[trial_id] = i
            try:
                self.studies()[i].tell(trial, value if state == State.COMPLETE else None, state=state)
            except Exception as e:  # noqa: BLE001 - e.g. a NaN objective: the study keeps the trial as failed
                logger.warning("trial %s: %s", trial_id, e)

    def group_index(self, trial_config: dict) -> int | None:
        """The group whose fixed config a trial's ``config["trial"]`` carries (``None``: not one of this sweep)."""
        norm = json.loads(json.dumps(trial_config, default=str))
        for i, g in enumerate(self._groups):
            if all(k in norm and norm[k] == v for k, v in json.loads(json.dumps(g, default=str)).items()):
                return i
        return None

    def reconcile(self, trials: dict[str, dict]) -> None:
        """Recount the quotas from the trials Tune restores (trial id -> config): a group's issued count is the
        number of its trials Tune knows, whatever the (possibly older or newer) searcher state said, plus those its
        study holds as ended that Tune lost (started and ended after Tune's last save: their results are in the
        study and the tables, and Tune never runs them again). One Tune lost while running is not counted: another
        trial takes its place (its records are removed, orchestrator.records.lost_trials)."""
        self.studies()  # finds the studies' running and finished trials again (by Tune trial id)
        self._issued, self._group_of, self._adopted = [0] * len(self._groups), {}, {}
        for trial_id, i in self._told.items():
            if trial_id not in trials:
                self._issued[i] += 1
                self._group_of[trial_id] = i
        for trial_id, config in trials.items():
            i = self.group_index(config.get("trial", {}))
            if i is None:
                continue
            self._issued[i] += 1
            self._group_of[trial_id] = i
            if trial_id not in self._open and trial_id not in self._told:  # its study never saw it
                self._adopted[trial_id] = {k: config["trial"][k] for k in self._space if k in config["trial"]}

    def restore_from_dir(self, checkpoint_dir: str) -> None:
        super().restore_from_dir(checkpoint_dir)
        trials = tune_trials(checkpoint_dir)
        if trials is not None:
            self.reconcile(trials)

    def _fingerprint(self) -> dict:
        return json.loads(json.dumps({"groups": self._groups, "space": self._space, "quota": self._quota}))

    def save(self, checkpoint_path: str) -> None:
        """The searcher's own bookkeeping as JSON (the studies are in the journal storage already)."""
        state = {
            "format": STATE_FORMAT,
            **self._fingerprint(),
            "issued": self._issued,
            "next": self._next,
            "group_of": self._group_of,
            "adopted": self._adopted,
        }
        with open(checkpoint_path, "w") as f:
            json.dump(state, f)

    def restore(self, checkpoint_path: str) -> None:
        """Read what `save` wrote: JSON only; any other file (an older bcrit's pickle) is refused, not unpickled."""
        state = read_state(checkpoint_path, STATE_FORMAT)
        if state is None:
            raise ValueError(
                f"{checkpoint_path}: not a bcrit searcher state (JSON, {STATE_FORMAT}); a sweep of an older bcrit "
                "(its searcher state was a pickle, which is not loaded) cannot be resumed: start it again"
            )
        if {k: state[k] for k in ("groups", "space", "quota")} != self._fingerprint():
            raise ValueError(f"{checkpoint_path}: searcher state of another sweep spec (groups, ranges or quota)")
        self._issued, self._next = list(state["issued"]), int(state["next"])
        self._group_of = {k: int(v) for k, v in state["group_of"].items()}
        self._adopted = dict(state["adopted"])


def tune_trials(experiment_dir: str) -> dict[str, dict] | None:
    """Trial id -> config of the trials in Tune's newest experiment state in ``experiment_dir`` (the ones
    ``Tuner.restore`` re-creates); ``None`` when there is none. Reads Tune's own file with Tune's own loaders."""
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
