"""The Ray Tune ``Tuner`` of a sweep: its trainable and resources, its search, bcrit's driver-side callbacks; a
sweep restored with ``Tuner.restore``; ``run``, which leaves no MLflow run RUNNING when the fit is interrupted."""

from __future__ import annotations

from ray import tune
from ray.tune import Tuner
from ray.tune.execution.placement_groups import PlacementGroupFactory

from analysis.features.stop_behind.stop_behind import Seeds, centre_first
from orchestrator.cluster.ray_logs import quiet_driver_logs
from orchestrator.cluster.ray_start import on_cluster, sweep_capacity
from orchestrator.cluster.sizing import concurrency, trial_bundle
from orchestrator.errors import UserError
from orchestrator.execution.preflight import check_spec, trial_configs
from orchestrator.execution.sweep_state import can_restore
from orchestrator.execution.tune_trainable import make_trainable
from orchestrator.faults import fault_callbacks
from orchestrator.features.adaptive.adaptive_resume import renew
from orchestrator.features.adaptive.adaptive_search import AdaptiveSearch
from orchestrator.features.adaptive.adaptive_view import AdaptiveWatch
from orchestrator.features.stop_behind.behind_callback import StopBehind
from orchestrator.records.lost_trials import ForgetLost
from orchestrator.records.mlflow_tracking import MLflowTracking
from orchestrator.records.progress import SweepProgress
from orchestrator.records.tables_callback import StripRows, TablesCallback
from orchestrator.search.optuna_search import GroupedOptunaSearch
from orchestrator.specs.sweep_spec import SweepSpec
from orchestrator.storage.layout import TUNE_DIR
from trainables.sweep_signal import signal_name


def sweep_trainable(spec: SweepSpec, worker_failures: int, verbose: bool = False):
    """The workload's Tune function trainable, holding what `trial_bundle` says (its Train workers hold their own)."""
    ends = spec.search == "adaptive" and spec.adaptive.end_running  # goal.running: end: its trials ask whether to end
    signal = signal_name(spec.sweep_dir) if ends or spec.stops_behind else None
    fn = make_trainable(spec.workload, spec.storage_root, worker_failures, verbose=verbose, signal=signal)
    return tune.with_resources(fn, lambda config: PlacementGroupFactory([trial_bundle(config["trial"])]))


def planned_seeds(spec, configs: list[dict] | None = None):
    """How many seeds each setting of the sweep will have (analysis.features.stop_behind.stop_behind.Seeds): a grid's
    configs counted; an adaptive sweep may give any setting every seed of its space; an Optuna study's settings one.
    ``configs``: the checked trial configs, as the trials receive them (their defaults filled in, so that a setting's
    key is the one its trials' rows give); default `orchestrator.execution.preflight.trial_configs`."""
    if spec.search == "grid":
        return Seeds.of_configs([c.to_dict() for c in trial_configs(spec)] if configs is None else configs)
    return Seeds(default=len(spec.seeds) if spec.search == "adaptive" else 1)


def callbacks(spec: SweepSpec, verbose: bool = False, total: int | None = None, configs=None) -> list:
    """The driver-side callbacks every bcrit sweep needs: MLflow tracking, the Parquet tables, the terminal
    (event lines; the live bar unless ``verbose``); on resume, trials Tune lost removed from the first two
    (orchestrator.records.lost_trials); fault injection for tests (orchestrator.faults); ``stopping.behind``'s
    (orchestrator.features.stop_behind.behind_callback), first, so that the others see why a trial stopped
    (``configs``: the checked trial configs, when the caller has them)."""
    tracking = MLflowTracking(spec.mlflow_uri, spec.experiment, spec.name, spec.sweep_dir, spec.to_yaml())
    progress = SweepProgress(spec.num_trials() if total is None else total, live=not verbose)
    watch = []
    if spec.search == "adaptive":  # its refits as progress lines and parent-run metrics
        watch = [AdaptiveWatch(spec.sweep_dir, tracking, progress)]
    tables = TablesCallback(spec.sweep_dir, storage_uri=spec.storage_uri)
    stop = []
    if spec.stops_behind:
        stop = [StopBehind(spec.sweep_dir, signal_name(spec.sweep_dir), planned_seeds(spec, configs))]
    return [*fault_callbacks(), ForgetLost(tracking, tables), *stop, *watch, tracking, tables, progress]


def build_tuner(
    spec: SweepSpec,
    *,
    configs: list[dict] | None = None,
    worker_failures: int = 3,
    trial_retries: int = 2,
    extra_callbacks: list | tuple = (),
    verbose: bool = False,
):
    """A ``Tuner`` for the spec (saves the resolved spec in the sweep dir, where ``restore_tuner`` reads it).
    ``extra_callbacks``: your own Tune callbacks, after bcrit's (tracking, tables, terminal); they still see each
    result's ``rows``, which a last callback then drops (orchestrator.records.tables_callback.StripRows).
    ``verbose``: Tune's
    own tables and Ray Train's INFO logs instead of bcrit's progress bar."""
    configs = configs if configs is not None else check_spec(spec)
    save_spec(spec)
    if spec.search == "grid":  # with stopping.behind, each batch size's middle lrs first (its likely best)
        if spec.stops_behind:
            configs = [configs[i] for i in centre_first(configs)]
        param_space, search_alg, num_samples = {"trial": tune.grid_search(configs)}, None, 1
    elif (
        spec.search == "adaptive"
    ):  # trials chosen by the B_crit interval until it stops (orchestrator.features.adaptive.adaptive_search)
        # one more than the space: the searcher, not Tune's count, ends the sweep (and records why)
        search_alg, param_space, num_samples = AdaptiveSearch.from_spec(spec), {}, len(configs) + 1
    # one TPE study per (batch size, split, seed) group; its quota of trials each (orchestrator.search.optuna_search)
    else:
        search_alg = GroupedOptunaSearch.from_spec(spec)
        param_space, num_samples = {}, search_alg.total_trials
    return tuner_of(
        spec,
        param_space,
        search_alg=search_alg,
        num_samples=num_samples,
        max_concurrent=sweep_concurrency(spec, configs),
        configs=configs,
        extra_callbacks=extra_callbacks,
        worker_failures=worker_failures,
        trial_retries=trial_retries,
        verbose=verbose,
    )


def tuner_of(
    spec,
    param_space: dict,
    *,
    max_concurrent: int,
    search_alg=None,
    num_samples: int = 1,
    name: str = TUNE_DIR,
    storage_path: str | None = None,
    total: int | None = None,
    configs: list[dict] | None = None,
    extra_callbacks: list | tuple = (),
    worker_failures: int = 3,
    trial_retries: int = 2,
    verbose: bool = False,
):
    """The ``Tuner`` of a sweep's (or a branched study phase's) trials: the workload's trainable (`sweep_trainable`),
    bcrit's callbacks (`callbacks`; ``total`` trials on the bar) then ``extra_callbacks``, Tune's experiment ``name``
    under ``storage_path`` (default the spec's storage root), trial directories named by trial id."""
    quiet_driver_logs(verbose)
    return tune.Tuner(
        sweep_trainable(spec, worker_failures, verbose),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            search_alg=search_alg,
            num_samples=num_samples,
            max_concurrent_trials=max_concurrent,
            trial_dirname_creator=lambda t: t.trial_id,
            reuse_actors=True,  # in-process trials skip the actor start and torch import
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=spec.storage_root if storage_path is None else storage_path,
            callbacks=[*callbacks(spec, verbose, total, configs=configs), *extra_callbacks, StripRows()],
            failure_config=tune.FailureConfig(max_failures=trial_retries),
            verbose=1 if verbose else 0,  # 0: none of Tune's boxes (Ray 2.60's output ignores progress_reporter)
        ),
    )


def sweep_concurrency(spec: SweepSpec, configs: list[dict]) -> int:
    """Tune's ``max_concurrent_trials`` (orchestrator.cluster.sizing.concurrency) on the Ray this driver
    holds: the local one it started, or the cluster at ``RAY_ADDRESS``."""
    return concurrency(configs, sweep_capacity(), spec.search, on_cluster())


def restore_tuner(spec: SweepSpec, worker_failures: int = 3, verbose: bool = False):
    """``Tuner.restore`` of the sweep: finished trials stay finished, unfinished ones resume from checkpoints.
    (The run config, callbacks included, is the one the sweep was started with: ``verbose`` sets the trainable
    and the driver's logs.)"""
    path = spec.layout.tune
    if not can_restore(spec.sweep_dir, spec.storage_uri):
        raise UserError(f"{spec.sweep_dir}: no interrupted sweep to resume; run it without --resume")
    quiet_driver_logs(verbose)
    tuner = Tuner.restore(path, trainable=sweep_trainable(spec, worker_failures, verbose), resume_unfinished=True)
    if (
        spec.search == "adaptive"
    ):  # its goal and budget may have changed (orchestrator.features.adaptive.adaptive_resume)
        renew(tuner._local_tuner._tune_config.search_alg, spec, path)
        for cb in _tuner_callbacks(tuner):
            if isinstance(cb, SweepProgress):
                cb.total = spec.num_trials()  # the bar's total under the new budget
        save_spec(spec)
    return tuner


def run(tuner, spec: SweepSpec):
    """Fit the tuner; on any interruption every MLflow run this driver opened is ended (KILLED), none RUNNING."""
    try:
        return tuner.fit()
    except BaseException:
        for cb in _tuner_callbacks(tuner):
            if isinstance(cb, MLflowTracking):
                cb.close("KILLED")
        raise


def save_spec(spec: SweepSpec) -> None:
    """The resolved spec in the sweep directory: what ``--resume`` reads."""
    with open(spec.layout.spec, "w") as f:
        f.write(spec.to_yaml())


def _tuner_callbacks(tuner) -> list:
    internal = getattr(tuner, "_local_tuner", None)
    rc = getattr(internal, "_run_config", None) if internal else None
    return list(getattr(rc, "callbacks", None) or [])
