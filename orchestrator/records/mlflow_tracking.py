"""MLflow tracking of a sweep: a Ray Tune callback running in the driver, the ONLY MLflow writer (many processes
writing one SQLite store race, and ``MLflowLoggerCallback`` duplicates runs after restore and does not nest:
docs/design.md).

- One parent run per sweep (found again through ``<sweep_dir>/mlflow_parent.json`` on resume): the resolved spec,
  flattened params, the environment, and at the end a summary (trial counts per status, ``summary.json``).
- One nested child run per trial (tags ``mlflow.parentRunId``, ``trial_id``, ``status``): the flattened trial config,
  every row of every result as a metric with its ``step``. A retried or restored trial finds its child again by tag
  ``trial_id``; rows at or below the child's ``bcrit.watermark`` tag (set in the same ``log_batch``) are not logged
  again.
- Every run ends terminal: FINISHED (trial ended itself), FAILED (trial error), KILLED (driver interrupted). What
  else each run carries: orchestrator.records.run_fields. A new experiment keeps its artifacts beside its SQLite
  store. MLflow's "View run ..." lines are not printed for these runs (`quiet_end`); ``bcrit sweep`` prints the
  parent run's link once."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import time
import uuid
from importlib import metadata
from typing import Any

import yaml
from ray.tune import Callback

from analysis.core import metrics as M
from analysis.sources.schema import BRANCH_SETTINGS_FILE
from orchestrator.faults import fault_point
from orchestrator.records import run_fields as F
from orchestrator.storage.layout import PARENT_FILE, SPEC_FILE

WATERMARK_TAG = "bcrit.watermark"
MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch call
MAX_PARAMS = 100  # ... and of params


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists kept as values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# mlflow.environment_variables.MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT, read by MLflow each time it ends a run
# (TrackingServiceClient._log_url, only for an http(s):// tracking server)
QUIET_URLS_ENV = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


@contextlib.contextmanager
def _no_run_links():
    """MLflow's two stdout lines per ended run held back for the ``with`` block; the variable restored after."""
    was = os.environ.get(QUIET_URLS_ENV)
    os.environ[QUIET_URLS_ENV] = "true"
    try:
        yield
    finally:
        if was is None:
            os.environ.pop(QUIET_URLS_ENV, None)
        else:
            os.environ[QUIET_URLS_ENV] = was


def quiet_end(client, run_id: str, status: str) -> None:
    """``client.set_terminated(run_id, status)`` without MLflow's "View run / View experiment" lines."""
    with _no_run_links():
        client.set_terminated(run_id, status=status)


def environment() -> dict[str, str]:
    env = {"host": socket.gethostname(), "python": platform.python_version()}
    for pkg in ("ray", "torch", "diffusers", "mlflow", "optuna", "pyarrow"):
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            env[pkg] = "not installed"
    return env


class MLflowTracking(Callback):
    """Parent run per sweep + one nested child run per trial (see module docstring)."""

    def __init__(self, tracking_uri: str, experiment: str, sweep_name: str, sweep_dir: str, spec_yaml: str = ""):
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.sweep_name = sweep_name
        self.sweep_dir = os.path.abspath(sweep_dir)
        self.spec_yaml = spec_yaml
        self._client = None
        self.experiment_id: str | None = None
        self.parent_id: str | None = None
        self._children: dict[str, str] = {}  # trial_id -> run_id
        self._marks: dict[str, int] = {}  # trial_id -> max step logged
        self._status: dict[str, str] = {}  # trial_id -> last status seen

    # --- parent -----------------------------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            # MLflow: deferred, importing mlflow_tracking loads no MLflow
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def setup(self, **info) -> None:
        self.open_parent()

    def open_parent(self) -> str:
        """Create the parent run, or reopen the one this sweep dir recorded (resume).

        Crash-safe: ``mlflow_parent.json`` is written (atomically) with a fresh ``sweep_uid`` and no ``run_id``
        *before* the run is created with tag ``bcrit.sweep_uid``; a driver killed in between leaves that pending
        record, and the next start finds the run by its tag and adopts it -- one parent per sweep, never a second
        one, never one left RUNNING once the sweep is resumed."""
        if self.parent_id:
            return self.parent_id
        saved = self._read_parent_file()
        if saved.get("tracking_uri") == self.tracking_uri and saved.get("run_id"):
            self.experiment_id, self.parent_id = saved["experiment_id"], saved["run_id"]
            self.client.update_run(self.parent_id, status="RUNNING")
            self.client.set_tag(self.parent_id, "bcrit.resumed_at", time.strftime("%Y-%m-%dT%H:%M:%S"))
            return self.parent_id
        exp = self.client.get_experiment_by_name(self.experiment)
        self.experiment_id = exp.experiment_id if exp else self._create_experiment()
        uid = saved.get("sweep_uid") if saved.get("tracking_uri") == self.tracking_uri else None
        found = self._find_parent(uid) if uid else None
        if found is not None:  # created by a driver killed before it recorded the run id: adopt it
            self.parent_id = found
            self.client.update_run(found, status="RUNNING")
            self.client.set_tag(found, "bcrit.resumed_at", time.strftime("%Y-%m-%dT%H:%M:%S"))
        else:
            uid = uid or uuid.uuid4().hex
            self._write_parent_file({"sweep_uid": uid, "run_id": None})
            run = self.client.create_run(
                self.experiment_id,
                run_name=self.sweep_name,
                tags={
                    "bcrit.role": "sweep",
                    "bcrit.sweep_dir": self.sweep_dir,
                    "bcrit.sweep": self.sweep_name,
                    "bcrit.sweep_uid": uid,
                    **self._parent_tags(),
                },
            )
            self.parent_id = run.info.run_id
            fault_point("parent_created")
        # MLflow: deferred, importing mlflow_tracking loads no MLflow
        from mlflow.entities import Param

        params = [Param(f"env.{k}", v) for k, v in environment().items()]
        if self.spec_yaml:
            # spec_yaml is SweepSpec.to_yaml(), which plain PyYAML reads as bcrit's loader does (yaml_overrides)
            spec = flatten(yaml.safe_load(self.spec_yaml) or {}, "spec.")
            params += [Param(k, str(v)[:6000]) for k, v in spec.items()]
            self.client.log_text(self.parent_id, self.spec_yaml, SPEC_FILE)
        logged = self.client.get_run(self.parent_id).data.params if found is not None else {}
        params = [p for p in params if p.key not in logged]  # an adopted run may hold some already
        for i in range(0, len(params), MAX_PARAMS):
            self.client.log_batch(self.parent_id, params=params[i : i + MAX_PARAMS])
        self._log_study_settings()
        self._write_parent_file({"sweep_uid": uid, "run_id": self.parent_id})
        return self.parent_id

    def _log_study_settings(self) -> None:
        """A branched study's analysis settings (the file ``bcrit branch`` writes before its first trial) as an
        artifact of the parent run, so that ``bcrit analyze --mlflow-experiment`` reads the same settings."""
        path = os.path.join(self.sweep_dir, BRANCH_SETTINGS_FILE)
        if os.path.isfile(path):
            self.client.log_artifact(self.parent_id, path)

    def _read_parent_file(self) -> dict:
        path = os.path.join(self.sweep_dir, PARENT_FILE)
        if not os.path.exists(path):
            return {}
        try:
            with open(path) as f:
                saved = json.load(f)
        except ValueError:  # garbled (written by hand?): treated as absent, a new parent is recorded
            return {}
        return saved if isinstance(saved, dict) else {}

    def _write_parent_file(self, record: dict) -> None:
        path = os.path.join(self.sweep_dir, PARENT_FILE)
        os.makedirs(self.sweep_dir, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump({"tracking_uri": self.tracking_uri, "experiment_id": self.experiment_id, **record}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    def _find_parent(self, uid: str) -> str | None:
        found = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`bcrit.sweep_uid` = '{uid}'", max_results=2
        )
        return found[0].info.run_id if found else None

    def _create_experiment(self) -> str:
        loc = F.artifact_location(self.tracking_uri, self.sweep_dir, self.experiment)
        return self.client.create_experiment(self.experiment, artifact_location=loc, tags=F.EXPERIMENT_TAGS)

    def _parent_tags(self) -> dict[str, str]:
        spec = (yaml.safe_load(self.spec_yaml) if self.spec_yaml else None) or {}
        return {**F.code_tags(), F.TAG_DESCRIPTION: F.parent_description(self.sweep_name, self.sweep_dir, spec)}

    # --- children ---------------------------------------------------------------------------------------------
    def child(self, trial_id: str, cfg: dict, trial_dir: str | None = None) -> str:
        """The child run of a trial: cached, else found by tag ``trial_id`` under the parent, else created."""
        if trial_id in self._children:
            return self._children[trial_id]
        parent = self.open_parent()
        found = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and tags.trial_id = '{trial_id}'",
            max_results=2,
        )
        if found:
            run = found[0]
            self._marks[trial_id] = int(run.data.tags.get(WATERMARK_TAG, -1))
            self._status[trial_id] = run.data.tags.get("status", M.STATUS_RUNNING)
            if run.info.status != "RUNNING" and self._status[trial_id] not in M.FINAL_STATUSES:
                self.client.update_run(run.info.run_id, status="RUNNING")
            self._children[trial_id] = run.info.run_id
            return run.info.run_id
        # MLflow: deferred, importing mlflow_tracking loads no MLflow
        from mlflow.entities import Param

        name = f"B{cfg['batch_size']}-{cfg['micro_batch_size']}x{cfg.get('grad_accum')}x{max(1, cfg['num_workers'])}"
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{name}-lr{cfg['lr']:.3g}-s{cfg.get('seed', 0)}-{trial_id}",
            tags={
                "mlflow.parentRunId": parent,
                "trial_id": trial_id,
                "status": M.STATUS_RUNNING,
                **F.code_tags(),
                **({F.TAG_TRIAL_DIR: trial_dir} if trial_dir else {}),
                F.TAG_DESCRIPTION: F.child_description(trial_id, cfg, self.sweep_name, trial_dir),
            },
        )
        run_id = run.info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in flatten(cfg).items()]
        now = int(time.time() * 1000)
        numeric = F.metric_entities((k, v, now, 0) for k, v in F.numeric_copies(cfg).items())
        for i in range(0, len(params), MAX_PARAMS):
            self.client.log_batch(run_id, params=params[i : i + MAX_PARAMS], metrics=numeric if i == 0 else [])
        inputs = F.dataset_inputs(cfg)
        if inputs:
            self.client.log_inputs(run_id, datasets=inputs)
        self.client.log_dict(run_id, cfg, "trial_config.json")
        self._children[trial_id], self._marks[trial_id], self._status[trial_id] = run_id, -1, M.STATUS_RUNNING
        return run_id

    def log_rows(
        self,
        trial_id: str,
        rows: list,
        status: str | None = None,
        result: dict | None = None,
        extra_tags: dict[str, str] | None = None,
    ) -> int:
        """Log rows past the watermark, whole steps per ``log_batch`` (rows + watermark tag in one call), each
        step with ``examples`` and ``wall_time``, stamped with the time of the measurement. The last batch also
        carries the status tag, ``extra_tags`` and, for a trial that reached its target, the outcome metrics."""
        # MLflow: deferred, importing mlflow_tracking loads no MLflow
        from mlflow.entities import RunTag

        result = result or {}
        run_id, mark = self._children[trial_id], self._marks.get(trial_id, -1)
        new = [r for r in rows if int(r[0]) > mark]
        now = int(time.time() * 1000)
        groups = F.step_groups(new, F.row_times_ms(new, result, now))
        final_metrics = F.metric_entities((k, v, now, int(result.get(M.STEP, 0))) for k, v in F.outcome(result).items())
        final_tags = [RunTag(k, v) for k, v in {**(extra_tags or {}), **({"status": status} if status else {})}.items()]
        batch: list = []
        written = 0

        def flush(done: int, last: bool) -> None:
            nonlocal batch, written
            tags = [RunTag(WATERMARK_TAG, str(done)), *(final_tags if last else [])]
            self.client.log_batch(run_id, metrics=batch + (final_metrics if last else []), tags=tags)
            written += len(batch)
            self._marks[trial_id] = done
            batch = []

        room = MAX_BATCH - len(final_metrics)
        for i, (step, values) in enumerate(groups):
            for j in range(0, len(values), room):  # a step larger than one batch is split (rare)
                chunk = values[j : j + room]
                if batch and len(batch) + len(chunk) > room:
                    flush(step - 1, last=False)
                batch += F.metric_entities((n, v, ms, step) for n, v, ms in chunk)
            if i + 1 == len(groups):
                flush(step, last=True)
        if not groups and (final_tags or final_metrics):
            self.client.log_batch(run_id, metrics=final_metrics, tags=final_tags)
        return written

    def end_child(self, trial_id: str, status: str, run_status: str) -> None:
        run_id = self._children.get(trial_id)
        if run_id is None:
            return
        self.client.set_tag(run_id, "status", status)
        quiet_end(self.client, run_id, run_status)
        self._status[trial_id] = status

    def forget_lost(self, known: set[str]) -> list[str]:
        """Delete the parent's child runs still "running" whose trial is not in ``known`` (the trials Tune
        restored: orchestrator.records.lost_trials); returns their trial ids."""
        parent = self.open_parent()
        query = f"tags.`mlflow.parentRunId` = '{parent}' and tags.status = '{M.STATUS_RUNNING}'"
        lost, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], filter_string=query, page_token=token)
            lost += [r for r in page if r.data.tags.get("trial_id") not in known]
            token = page.token
            if not token:
                break
        for run in lost:
            self.client.delete_run(run.info.run_id)
            tid = run.data.tags.get("trial_id")
            self._children.pop(tid, None)
            self._marks.pop(tid, None)
            self._status.pop(tid, None)
        return sorted(str(r.data.tags.get("trial_id")) for r in lost)

    # --- Tune callback hooks ----------------------------------------------------------------------------------
    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.child(trial.trial_id, trial.config["trial"], trial.path)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.child(trial.trial_id, trial.config["trial"], trial.path)
        status = result.get("status", M.STATUS_RUNNING)
        ckpt = F.checkpoint_path(trial.path, result)
        tags = {F.TAG_CHECKPOINT: ckpt} if ckpt else {}
        if result.get(M.STOP_REASON):  # stopping.behind's why (orchestrator.features.stop_behind.behind_callback)
            tags[M.STOP_REASON] = str(result[M.STOP_REASON])
        self.log_rows(trial.trial_id, result.get("rows") or [], status, result=result, extra_tags=tags)
        if status != M.STATUS_RUNNING:
            self.end_child(trial.trial_id, status, "FINISHED")

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        if self._status.get(trial.trial_id) not in M.FINAL_STATUSES:
            last = (trial.last_result or {}).get("status", M.STATUS_FAILED)
            final = last if last in M.FINAL_STATUSES else M.STATUS_FAILED
            self.end_child(trial.trial_id, final, "FINISHED" if final != M.STATUS_FAILED else "FAILED")

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.child(trial.trial_id, trial.config["trial"], trial.path)
        self.end_child(trial.trial_id, M.STATUS_FAILED, "FAILED")

    def on_experiment_end(self, trials, **info) -> None:
        counts: dict[str, int] = {}
        for t in trials:
            s = self._status.get(t.trial_id) or (t.last_result or {}).get("status", "unknown")
            counts[s] = counts.get(s, 0) + 1
        self.close("FINISHED", {"trials": len(trials), "status_counts": counts})

    def close(self, run_status: str = "KILLED", summary: dict | None = None) -> None:
        """End every run this driver still holds open (children first), then the parent."""
        if self.parent_id is None:
            return
        for tid, run_id in self._children.items():
            if self._status.get(tid) not in M.FINAL_STATUSES:
                quiet_end(self.client, run_id, run_status)
        if summary is not None:
            self.client.log_dict(self.parent_id, summary, "summary.json")
            for k, v in summary.get("status_counts", {}).items():
                self.client.log_metric(self.parent_id, f"trials/{k}", v)
        quiet_end(self.client, self.parent_id, run_status)
