"""The sweep's Python API, for ``bcrit sweep`` and for users' own Tune scripts (see examples/sweep_script.py).

    spec = load_spec("examples/tiny.yaml")          # validated YAML (orchestrator.spec)
    check_spec(spec)                                 # every trial config + resources, storage, tracking
    tuner = build_tuner(spec)                        # Tuner: trainable, resources, search, callbacks
    results = run(tuner, spec)                       # fit; every MLflow run ends terminal
    results = run(restore_tuner(restore_spec(dir)), spec)  # continue an interrupted sweep

Resources (Ray Train V2): a trial with workers takes one CPU for its Tune driver; its workers get their own
placement group from Train, so the trial's own request must not include them (they would be reserved twice).
`max_concurrent_trials` keeps room for the largest trial's workers next to the running drivers.
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import time
from typing import Any

from orchestrator.overrides import UserError, load_yaml
from orchestrator.spec import SPEC_FILE, SweepSpec, load_spec, parse_spec
from orchestrator.tune_trainable import get_workload, make_trainable

TUNE_DIR = "tune"  # Tune experiment of the sweep: <sweep_dir>/tune


# --- validation --------------------------------------------------------------------------------------------------
def check_storage(sweep_dir: str, what: str = "storage") -> None:
    """The directory exists (created) and takes files; else one UserError line."""
    if os.path.exists(sweep_dir) and not os.path.isdir(sweep_dir):
        raise UserError(f"{what} {sweep_dir!r} is a file, not a directory; choose another storage path")
    try:
        os.makedirs(sweep_dir, exist_ok=True)
        probe = os.path.join(sweep_dir, f".bcrit-write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise UserError(f"{what} {sweep_dir!r} is not writable ({e.strerror}); choose another storage path") from None


def check_tracking(uri: str) -> None:
    """The tracking URI must be usable now: a SQLite file we can create, or a server that answers within seconds."""
    from analysis.mlflow_uri import TrackingUriError, check_tracking_uri

    try:
        check_tracking_uri(uri, create=True, what="tracking.mlflow_uri")
    except TrackingUriError as e:
        raise UserError(f"{e} (or unset tracking.mlflow_uri to use the embedded SQLite store)") from None


def check_spec(spec: SweepSpec, resources: dict | None = None) -> list[dict[str, Any]]:
    """Validate everything before launch: each trial config (``from_dict`` + the workload's check against
    ``resources``, default ``ray.cluster_resources()``), storage and tracking. Returns the trial-config dicts
    (normalised by the config class). Raises UserError; nothing is launched."""
    check_storage(spec.sweep_dir)
    check_tracking(spec.mlflow_uri)
    if resources is None:
        import ray

        resources = ray.cluster_resources()
        where = f"the Ray cluster ({int(resources.get('CPU', 0))} CPUs, {int(resources.get('GPU', 0))} GPUs)"
    else:
        where = (
            f"this machine ({os.cpu_count() or 1} cores, over-subscribed to {int(resources.get('CPU', 0))} logical "
            f"CPUs, {int(resources.get('GPU', 0))} GPUs)"
        )
    w = get_workload(spec.workload)
    from trainables.config import ConfigError

    out, checked = [], set()
    for raw in spec.trial_configs():
        trial = f"trial B={raw['batch_size']} split {raw['micro_batch_size']}x{raw['grad_accum']}x{raw['num_workers']}"
        try:
            cfg = w.config_cls.from_dict(raw)
        except (ConfigError, TypeError) as e:
            raise UserError(f"{trial}: {e}") from None
        need = trial_need(cfg.to_dict())
        for kind, n in need.items():
            if n > resources.get(kind, 0.0):
                raise UserError(
                    f"{trial} needs {n:g} {kind}s (1 Tune driver + {cfg.num_workers} workers x {cfg.cpus_per_worker})"
                    f" but {where} has {resources.get(kind, 0.0):g}; lower num_workers or cpus_per_worker, or set "
                    "RAY_ADDRESS to a bigger cluster"
                    if kind == "CPU" and cfg.num_workers
                    else f"{trial} needs {n:g} {kind}s but {where} has {resources.get(kind, 0.0):g}; lower its needs"
                )
        key = tuple(sorted((k, str(v)) for k, v in cfg.to_dict().items() if k not in ("lr", "seed")))
        if key not in checked:
            try:
                w.check(cfg, resources)
            except (ConfigError, TypeError) as e:
                raise UserError(f"{trial}: {e}") from None
            checked.add(key)
        out.append(cfg.to_dict())
    return out


# --- resources ---------------------------------------------------------------------------------------------------
def trial_bundle(cfg: dict) -> dict[str, float]:
    """What the Tune trial itself holds: its driver (1 CPU), or the whole in-process worker."""
    if int(cfg.get("num_workers", 0)) == 0:
        return {"CPU": float(cfg.get("cpus_per_worker", 1)), **({"GPU": 1.0} if cfg.get("use_gpu") else {})}
    return {"CPU": 1.0}


def trial_need(cfg: dict) -> dict[str, float]:
    """Everything a trial uses while it runs (driver + Train workers)."""
    w = int(cfg.get("num_workers", 0))
    if w == 0:
        return trial_bundle(cfg)
    need = {"CPU": 1.0 + w * float(cfg.get("cpus_per_worker", 1))}
    if cfg.get("use_gpu"):
        need["GPU"] = float(w)
    return need


def max_concurrent(configs: list[dict], resources: dict) -> int:
    """Trials that can run at once without a worker group waiting on drivers: total / largest need."""
    worst = 1 << 30
    for kind in ("CPU", "GPU"):
        need = max((trial_need(c).get(kind, 0.0) for c in configs), default=0.0)
        if need:
            worst = min(worst, math.floor(resources.get(kind, 0.0) / need))
    return max(1, worst)


def local_cpus(spec: SweepSpec | None = None) -> int:
    """Logical CPUs of the embedded local Ray: this machine's cores over-subscribed twice (each Tune driver takes
    a CPU besides its workers; REFERENCE.md), at least 4. Not grown to fit the spec: a trial larger than the
    machine is refused by `check_spec` (say what the machine has), not run at a crawl."""
    return max(4, 2 * (os.cpu_count() or 1))


def ray_cpus(configs: list[dict]) -> int:
    """Logical CPUs for an embedded local Ray that runs these trials two at a time (`max_concurrent`): twice the
    largest trial's need, at least twice this machine's cores. On 2 cores a sweep with a 2-worker trial (1 driver +
    2 workers) gets 6, so two trials run at once -- one per core -- instead of one after the other."""
    biggest = max((trial_need(c)["CPU"] for c in configs), default=1.0)
    return int(max(2 * (os.cpu_count() or 1), 2 * biggest))


# --- the Tuner ---------------------------------------------------------------------------------------------------
def _trainable(spec: SweepSpec, worker_failures: int, verbose: bool = False):
    from ray import tune
    from ray.tune.execution.placement_groups import PlacementGroupFactory

    fn = make_trainable(spec.workload, spec.sweep_dir, worker_failures, verbose=verbose)
    return tune.with_resources(fn, lambda config: PlacementGroupFactory([trial_bundle(config["trial"])]))


def callbacks(spec: SweepSpec, verbose: bool = False, total: int | None = None) -> list:
    """The driver-side callbacks every bcrit sweep needs: MLflow tracking, the Parquet tables, the terminal
    (event lines; the live bar unless ``verbose``); fault injection for tests (orchestrator.faults)."""
    from orchestrator.faults import fault_callbacks
    from orchestrator.progress import SweepProgress
    from orchestrator.tables import TablesCallback
    from orchestrator.tracking import MLflowTracking

    tracking = MLflowTracking(spec.mlflow_uri, spec.experiment, spec.name, spec.sweep_dir, spec.to_yaml())
    return [
        *fault_callbacks(),
        tracking,
        TablesCallback(spec.sweep_dir),
        SweepProgress(spec.num_trials() if total is None else total, live=not verbose),
    ]


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
    result's ``rows``, which a last callback then drops (orchestrator.progress.StripRows). ``verbose``: Tune's
    own tables and Ray Train's INFO logs instead of bcrit's progress bar."""
    import ray
    from ray import tune

    from orchestrator.progress import StripRows

    configs = configs if configs is not None else check_spec(spec)
    with open(os.path.join(spec.sweep_dir, SPEC_FILE), "w") as f:
        f.write(spec.to_yaml())
    if spec.search == "grid":
        param_space, search_alg, num_samples = {"trial": tune.grid_search(configs)}, None, 1
    else:  # one TPE study per (batch size, split, seed) group; its quota of trials each (orchestrator.search)
        from orchestrator.search import GroupedOptunaSearch

        search_alg = GroupedOptunaSearch.from_spec(spec)
        param_space, num_samples = {}, search_alg.total_trials
    quiet_driver_logs(verbose)
    return tune.Tuner(
        _trainable(spec, worker_failures, verbose),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            search_alg=search_alg,
            num_samples=num_samples,
            max_concurrent_trials=max_concurrent(configs, ray.cluster_resources()),
            trial_dirname_creator=lambda t: t.trial_id,
            reuse_actors=True,  # in-process trials skip the actor start and torch import
        ),
        run_config=tune.RunConfig(
            name=TUNE_DIR,
            storage_path=spec.sweep_dir,
            callbacks=[*callbacks(spec, verbose), *extra_callbacks, StripRows()],
            failure_config=tune.FailureConfig(max_failures=trial_retries),
            verbose=1 if verbose else 0,  # 0: none of Tune's boxes (Ray 2.60's output ignores progress_reporter)
        ),
    )


# --- what a sweep directory holds (checked before Ray starts) -------------------------------------------------
NO_SWEEP, UNSTARTED, RESTORABLE = "none", "unstarted", "restorable"


def sweep_state(sweep_dir: str) -> str:
    """`RESTORABLE`: Tune saved its experiment state (``Tuner.restore`` works); `UNSTARTED`: the driver died
    after writing ``tuner.pkl`` but before Tune's first ``experiment_state-*.json`` (``Tuner.can_restore`` says
    yes, then ``Tuner.restore`` fails with ``KeyError: 'trial'``); `NO_SWEEP`: no Tune experiment at all."""
    tune_dir = os.path.join(os.path.abspath(sweep_dir), TUNE_DIR)
    if not os.path.isfile(os.path.join(tune_dir, "tuner.pkl")):
        return NO_SWEEP
    if glob.glob(os.path.join(tune_dir, "experiment_state-*.json")):
        return RESTORABLE
    return UNSTARTED


def can_restore(sweep_dir: str) -> bool:
    return sweep_state(sweep_dir) == RESTORABLE


def has_results(sweep_dir: str) -> bool:
    """Metric rows of an earlier sweep in the directory (the tables or their parts)."""
    d = os.path.abspath(sweep_dir)
    return bool(glob.glob(os.path.join(d, "parts", "*", "m-*.parquet"))) or os.path.exists(
        os.path.join(d, "metrics.parquet")
    )


def reset_unstarted(spec: SweepSpec) -> None:
    """Clear what a sweep killed before Tune's first state file left behind -- Tune and Train directories, table
    parts, and the child runs under the MLflow parent (the parent itself is kept and adopted) -- so that it starts
    again from scratch with nothing stale mixed in."""
    import shutil

    from orchestrator.tables import PARTS
    from orchestrator.tune_trainable import TRAIN_DIR

    d = spec.sweep_dir
    for sub in (TUNE_DIR, TRAIN_DIR, PARTS):
        shutil.rmtree(os.path.join(d, sub), ignore_errors=True)
    for name in ("trials.parquet", "metrics.parquet"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(d, name))
    parent = recorded_parent(spec)
    if parent:
        from mlflow.tracking import MlflowClient

        from orchestrator.tracking import PARENT_FILE

        client = MlflowClient(spec.mlflow_uri)
        exp = client.get_run(parent).info.experiment_id
        for run in client.search_runs([exp], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'"):
            client.delete_run(run.info.run_id)
        if _saved_spec_text(d) != spec.to_yaml():
            # another spec starts here: the old parent (its params are the old spec's) ends; a new one is made
            client.set_terminated(parent, status="KILLED")
            os.remove(os.path.join(d, PARENT_FILE))


def _saved_spec_text(sweep_dir: str) -> str | None:
    try:
        with open(os.path.join(sweep_dir, SPEC_FILE)) as f:
            return f.read()
    except OSError:
        return None


def recorded_parent(spec: SweepSpec) -> str | None:
    """The MLflow parent run id the sweep dir recorded for the spec's tracking URI (None: none yet)."""
    import json

    from orchestrator.tracking import PARENT_FILE

    path = os.path.join(spec.sweep_dir, PARENT_FILE)
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("tracking_uri") != spec.mlflow_uri:
        return None
    return saved.get("run_id")


def check_resumable_tracking(spec: SweepSpec) -> None:
    """The MLflow parent a resumed sweep continues must still exist -- checked before Ray starts, touching
    nothing (a deleted SQLite store is not re-created empty)."""
    from analysis.mlflow_uri import sqlite_path
    from orchestrator.tracking import PARENT_FILE

    parent = recorded_parent(spec)
    if not parent:
        return
    fix = (
        f"restore it, or delete {os.path.join(spec.sweep_dir, PARENT_FILE)} to resume with a new MLflow parent run "
        "(the metric histories logged so far are then not in MLflow; the Parquet tables keep them)"
    )
    db = sqlite_path(spec.mlflow_uri)
    if db is not None and not os.path.exists(db):
        raise UserError(f"the sweep's MLflow store {db} is gone; {fix}")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(spec.mlflow_uri).get_run(parent)
    except MlflowException:
        raise UserError(f"the sweep's MLflow parent run {parent} is not in {spec.mlflow_uri}; {fix}") from None


def restore_spec(sweep_dir: str) -> SweepSpec:
    """The spec an existing sweep dir was started with."""
    path = os.path.join(os.path.abspath(sweep_dir), SPEC_FILE)
    if not os.path.exists(path):
        raise UserError(f"{sweep_dir}: not a bcrit sweep directory (no {SPEC_FILE}); pass the spec YAML instead")
    try:
        return parse_spec(load_yaml(path, allow_empty=False), sweep_dir=sweep_dir, source=path)
    except UserError as e:
        raise UserError(
            f"{e} -- {SPEC_FILE} is the spec this sweep was started with; restore it (it is also an artifact of "
            "the sweep's MLflow parent run) or start the sweep again in a new storage directory"
        ) from None


def restore_tuner(spec: SweepSpec, worker_failures: int = 3, verbose: bool = False):
    """``Tuner.restore`` of the sweep: finished trials stay finished, unfinished ones resume from checkpoints.
    (The run config, callbacks included, is the one the sweep was started with: ``verbose`` sets the trainable
    and the driver's logs.)"""
    from ray.tune import Tuner

    path = os.path.join(spec.sweep_dir, TUNE_DIR)
    if not can_restore(spec.sweep_dir):
        raise UserError(f"{spec.sweep_dir}: no interrupted sweep to resume; run it without --resume")
    quiet_driver_logs(verbose)
    return Tuner.restore(path, trainable=_trainable(spec, worker_failures, verbose), resume_unfinished=True)


def run(tuner, spec: SweepSpec):
    """Fit the tuner; on any interruption every MLflow run this driver opened is ended (KILLED), none RUNNING."""
    from orchestrator.tracking import MLflowTracking

    try:
        return tuner.fit()
    except BaseException:
        for cb in _tuner_callbacks(tuner):
            if isinstance(cb, MLflowTracking):
                cb.close("KILLED")
        raise


def _tuner_callbacks(tuner) -> list:
    internal = getattr(tuner, "_local_tuner", None)
    rc = getattr(internal, "_run_config", None) if internal else None
    return list(getattr(rc, "callbacks", None) or [])


def local_resources(spec: SweepSpec) -> dict[str, float]:
    """What the embedded local Ray of `start_ray` will hold (to validate before starting it)."""
    import torch

    return {"CPU": float(local_cpus(spec)), "GPU": float(torch.cuda.device_count())}


def start_ray(spec: SweepSpec, verbose: bool = False) -> None:
    """``RAY_ADDRESS`` if set, else a local Ray sized for the spec (trainables.trial.ensure_ray); without
    ``verbose``, Ray's known-harmless log lines are kept out of the terminal (orchestrator.ray_logs)."""
    from orchestrator.ray_logs import filter_driver_logs
    from trainables.trial import ensure_ray

    ensure_ray(num_cpus=max(local_cpus(spec), ray_cpus(spec.trial_configs())), quiet=not verbose)
    if not verbose:
        filter_driver_logs()


# --- output ------------------------------------------------------------------------------------------------------
QUIET_LOGGERS = (
    "ray.tune",  # "Wrote the latest version of all result files ..." and other per-sweep INFO lines
    "ray.train",
    "mlflow.store.db.utils",  # "Creating initial MLflow database tables..."
    "alembic",
)


class _DropSlowWarnings:
    """Tune's "The `callbacks.on_trial_result` operation took 0.5 s, which may be a performance bottleneck": our
    own driver-side writers (MLflow on SQLite, Parquet parts) on a busy machine; nothing a user can act on."""

    def filter(self, record) -> bool:
        return "performance bottleneck" not in record.getMessage()


_DROP_SLOW = _DropSlowWarnings()


def quiet_driver_logs(verbose: bool) -> None:
    """The driver's output without ``--verbose``: none of Tune's boxes and tables (Ray 2.60's new output prints its
    experiment box even at ``verbose=0`` and ignores a ``progress_reporter``: the classic output at verbosity 0
    prints nothing), no INFO logs of Tune, Train and MLflow's store set-up, no slow-callback warnings."""
    import logging

    os.environ["RAY_AIR_NEW_OUTPUT"] = "1" if verbose else "0"  # read by Tune when fit() starts
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    slow = logging.getLogger("ray.tune.utils.util")
    (slow.addFilter if not verbose else slow.removeFilter)(_DROP_SLOW)


def sweep(path: str, overrides: list[str] | None = None, *, resume: bool = False, verbose: bool = False):
    """Load, validate, run (or resume) a sweep; returns (spec, ResultGrid, wall seconds)."""
    spec = restore_spec(path) if os.path.isdir(path) else load_spec(path, overrides)
    start_ray(spec, verbose)
    t0 = time.perf_counter()
    tuner = restore_tuner(spec, verbose=verbose) if resume else build_tuner(spec, verbose=verbose)
    results = run(tuner, spec)
    return spec, results, time.perf_counter() - t0
