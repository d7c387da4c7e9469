"""Load recorded runs into :class:`Runs`: from a sweep directory's Parquet files or from an MLflow experiment.

Both paths produce the tables of :mod:`analysis.sources.schema`. :meth:`Runs.series` turns one metric into three flat
numpy arrays sorted by (trial, step), which is what the vectorised steps-to-target code consumes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analysis.core import metrics as m
from analysis.core.stages import BatchStages
from analysis.sources.schema import (
    BRANCH_COLUMNS,
    METRICS_FILE,
    PARENT,
    TRIALS_FILE,
    RunsTableError,
    metrics_table,
    string_codes,
    trials_table,
    validate_metrics,
    validate_trials,
)


@dataclass(frozen=True)
class Series:
    """One metric of every trial, sorted by (trial, step). ``trial`` indexes the rows of ``Runs.trials``."""

    trial: np.ndarray  # (n,) int64
    step: np.ndarray  # (n,) int64
    value: np.ndarray  # (n,) float64


# Written by the orchestrator into every sweep directory: {"tracking_uri", "experiment_id", "run_id"} of the
# sweep's MLflow parent run, so `bcrit analyze SWEEP_DIR` logs its results there too.
SWEEP_PARENT_FILE = "mlflow_parent.json"


@dataclass
class Runs:
    """A sweep's trials and metrics tables (validated), plus where they came from."""

    trials: pa.Table
    metrics: pa.Table
    source: str = ""
    tracking_uri: str | None = None  # set when loaded from MLflow
    parent_run_id: str | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @cached_property
    def trial_ids(self) -> list[str]:
        return pc.cast(self.trials.column("trial_id"), pa.string()).to_pylist()

    @cached_property
    def batch_size(self) -> np.ndarray:
        return self.trials.column("batch_size").to_numpy()

    @cached_property
    def status(self) -> np.ndarray:
        return np.asarray(pc.cast(self.trials.column("status"), pa.string()).to_pylist(), dtype=object)

    @cached_property
    def _codes(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(trial row of each metrics row, metric code of each row, metric names)."""
        tcode, tdict = string_codes(self.metrics.column("trial_id"))
        mcode, mdict = string_codes(self.metrics.column("metric"))
        row_of = {t: i for i, t in enumerate(self.trial_ids)}
        lookup = np.array([row_of.get(t, -1) for t in tdict], dtype=np.int64)
        return (lookup[tcode] if len(tcode) else tcode), mcode, mdict

    def metric_names(self) -> list[str]:
        return sorted(self._codes[2])

    def series(self, metric: str) -> Series:
        """Rows of ``metric`` as flat arrays sorted by (trial, step); empty arrays when nobody reported it."""
        if metric in self._cache:
            return self._cache[metric]
        trial, mcode, names = self._codes
        if metric not in names:
            empty = np.zeros(0, np.int64)
            return Series(empty, empty, np.zeros(0))
        mask = mcode == names.index(metric)
        t, s = trial, self.metrics.column("step").to_numpy()
        v = self.metrics.column("value").to_numpy()
        if len(names) > 1:  # a table holding one metric needs no selection (and no copies)
            t, s, v = t[mask], s[mask], v[mask]
        key = t * (int(s.max()) + 1) + s
        if not (np.diff(key) >= 0).all():  # sorted is the recommended layout: skip the sort then
            order = np.argsort(key, kind="stable")
            t, s, v = t[order], s[order], v[order]
        out = Series(t, s, v.astype(np.float64, copy=False))
        self._cache[metric] = out
        return out


def load_sweep_dir(path: str | Path) -> Runs:
    """Read ``trials.parquet`` and ``metrics.parquet`` from a sweep directory and validate them."""
    root = Path(path)
    if not root.is_dir():
        raise RunsTableError(f"{root}: no such sweep directory")
    tables = []
    for name in (TRIALS_FILE, METRICS_FILE):
        file = root / name
        if not file.is_file():
            raise RunsTableError(f"{file}: missing; a sweep directory holds {TRIALS_FILE} and {METRICS_FILE}")
        try:
            tables.append(pq.read_table(file, read_dictionary=["trial_id", "metric", "status"]))
        except (pa.ArrowInvalid, OSError) as e:
            raise RunsTableError(f"{file}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    trials, metrics = tables
    validate_trials(trials)
    validate_metrics(metrics, trial_ids=trials.column("trial_id"))
    parent = _sweep_parent(root)
    return Runs(
        trials, metrics, source=str(root), tracking_uri=parent.get("tracking_uri"), parent_run_id=parent.get("run_id")
    )


def _sweep_parent(root: Path) -> dict:
    """The sweep's MLflow parent run as recorded by the orchestrator (``{}`` for a directory without one)."""
    file = root / SWEEP_PARENT_FILE
    if not file.is_file():
        return {}
    try:
        saved = json.loads(file.read_text())
    except (OSError, ValueError):
        raise RunsTableError(f"{file}: not valid JSON; delete it to analyse the directory without MLflow") from None
    return saved if isinstance(saved, dict) else {}


_INT_PARAMS = ("batch_size", "micro_batch_size", "grad_accum", "num_workers", "seed")
_RUN_STATUS = {
    "RUNNING": m.STATUS_RUNNING,
    "SCHEDULED": m.STATUS_RUNNING,
    "FAILED": m.STATUS_FAILED,
    "KILLED": m.STATUS_FAILED,
}


def load_mlflow(experiment_name: str, tracking_uri: str | None = None, parent_run_id: str | None = None) -> Runs:
    """Read a sweep from MLflow: the parent run's nested child runs (tag ``mlflow.parentRunId``) are the
    trials.

    Child params give the trial columns (``batch_size``, ``micro_batch_size``, ``grad_accum``,
    ``num_workers``,
    ``lr``, ``seed``; other params are kept as string columns), tag ``trial_id`` the id (else the run
    name), tag ``status`` the status (else derived from the run state: RUNNING → running, FAILED/KILLED →
    failed, FINISHED → budget_spent). Metric histories become rows with ``examples = step * batch_size``
    (summed over the stages of a ``batch_schedule`` param).
    Without ``parent_run_id``, the most recent run of the experiment that has children is the parent.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        raise RunsTableError(f"MLflow experiment {experiment_name!r} not found at {client.tracking_uri}")
    runs = _all_runs(client, exp.experiment_id)
    children: dict[str, list] = {}
    for r in runs:
        pid = r.data.tags.get("mlflow.parentRunId")
        if pid:
            children.setdefault(pid, []).append(r)
    if parent_run_id is None:
        parents = [r for r in runs if r.info.run_id in children]
        if not parents:
            raise RunsTableError(f"MLflow experiment {experiment_name!r} has no parent run with nested child runs")
        parent_run_id = max(parents, key=lambda r: r.info.start_time or 0).info.run_id
    elif not any(r.info.run_id == parent_run_id for r in runs):
        raise RunsTableError(
            f"MLflow run {parent_run_id} is not a run of experiment {experiment_name!r} at {client.tracking_uri}; "
            "omit --parent-run-id to take the newest sweep of the experiment"
        )
    kids = children.get(parent_run_id, [])
    if not kids:
        raise RunsTableError(f"MLflow run {parent_run_id} has no nested child runs (tag mlflow.parentRunId)")
    latest: dict[str, object] = {}  # a trial retried after Tuner.restore may have several runs: keep the newest
    for r in sorted(kids, key=lambda r: r.info.start_time or 0):
        latest[r.data.tags.get("trial_id") or r.info.run_name or r.info.run_id] = r
    trials, metrics = _tables_from_runs(client, list(latest.values()))
    validate_trials(trials)
    validate_metrics(metrics, trial_ids=trials.column("trial_id"))
    return Runs(
        trials,
        metrics,
        source=f"mlflow:{experiment_name}/{parent_run_id}",
        tracking_uri=client.tracking_uri,
        parent_run_id=parent_run_id,
    )


def _all_runs(client, experiment_id: str) -> list:
    out, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _tables_from_runs(client, kids: list) -> tuple[pa.Table, pa.Table]:
    cols: dict[str, list] = {k: [] for k in ("trial_id", *_INT_PARAMS, "lr", "status")}
    extra: dict[str, list] = {}
    rows: dict[str, list] = {k: [] for k in ("trial_id", "step", "examples", "metric", "value", "wall_time")}
    for i, r in enumerate(kids):
        p, tags = r.data.params, r.data.tags
        tid = tags.get("trial_id") or r.info.run_name or r.info.run_id
        try:
            ints = {k: int(p[k]) for k in _INT_PARAMS}
            ints["num_workers"] = max(1, ints["num_workers"])  # 0 = in-process: one worker, as in trials.parquet
            lr = float(p["lr"])
        except KeyError as e:
            raise RunsTableError(f"MLflow run {r.info.run_id} ({tid}): missing param {e.args[0]!r}") from None
        except ValueError as e:
            raise RunsTableError(f"MLflow run {r.info.run_id} ({tid}): bad param value ({e})") from None
        status = tags.get("status") or _RUN_STATUS.get(r.info.status, m.STATUS_BUDGET_SPENT)
        for k, v in {"trial_id": tid, **ints, "lr": lr, "status": status}.items():
            cols[k].append(v)
        for k, v in p.items():
            if k not in cols:
                extra.setdefault(k, [None] * i).append(v)
        for v in extra.values():
            v.extend([None] * (i + 1 - len(v)))
        start = r.info.start_time or 0
        examples_at = _examples_at(p.get("batch_schedule"), ints["batch_size"], r.info.run_id, tid)
        for key in sorted(r.data.metrics):
            if key in m.TRACKING_ONLY:  # counters, sortable copies, outcomes: not reported rows
                continue
            last: dict[int, object] = {}  # one value per step: a re-logged step keeps the latest
            for h in sorted(client.get_metric_history(r.info.run_id, key), key=lambda h: h.timestamp):
                last[h.step] = h
            for step, h in sorted(last.items()):
                rows["trial_id"].append(tid)
                rows["step"].append(step)
                rows["examples"].append(examples_at(step))
                rows["metric"].append(key)
                rows["value"].append(float(h.value))
                rows["wall_time"].append((h.timestamp - start) / 1000.0)
    trials = trials_table({**cols, **_branch_columns(extra)})
    return trials, metrics_table(rows)


_BRANCH_PARAMS = {"parent_trial_id": str, "branch_step": int, "k": float}  # logged as params extra.<name>


def _examples_at(schedule: str | None, batch_size: int, run_id: str, tid: str):
    """``step -> examples`` of a run: ``step x batch_size``, or summed over the stages of its ``batch_schedule``
    param (analysis.core.stages; MLflow keeps it as the list's text)."""
    if not schedule or schedule == "[]":
        return lambda step: step * batch_size

    try:
        stages = BatchStages.from_schedule(batch_size, json.loads(schedule))
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise RunsTableError(f"MLflow run {run_id} ({tid}): bad param batch_schedule ({e})") from None
    return stages.examples


def _branch_columns(extra: dict[str, list]) -> dict[str, list]:
    """A branched study's child params ``extra.parent_trial_id``, ``extra.branch_step``, ``extra.k`` as the typed
    trials columns ``bcrit branch`` writes to ``trials.parquet`` (null on the reference's row)."""
    if "extra.parent_trial_id" not in extra:
        return extra
    out = {k: v for k, v in extra.items() if k.removeprefix("extra.") not in _BRANCH_PARAMS}
    for name, cast in _BRANCH_PARAMS.items():
        values = extra.get(f"extra.{name}", [None] * len(extra["extra.parent_trial_id"]))
        out[name] = [None if v in (None, "None", "") else cast(v) for v in values]
    return out


def runs_from_tables(trials: pa.Table, metrics: pa.Table, source: str = "") -> Runs:
    """Validate in-memory tables (e.g. from an exporter) and wrap them as :class:`Runs`."""
    validate_trials(trials)
    validate_metrics(metrics, trial_ids=trials.column("trial_id"))
    return Runs(trials, metrics, source=source)


def subset_tables(runs: Runs, ids: list[str]) -> tuple[pa.Table, pa.Table]:
    """The trial and metric rows of the trials ``ids`` of ``runs``, their ``trial_id`` as plain strings (a dictionary
    column would keep the others' ids, which the loaders' check refuses): ``runs_from_tables`` reads them back."""
    keep = pa.array(ids, pa.string())
    tables = []
    for t in (runs.trials, runs.metrics):
        i = t.schema.get_field_index("trial_id")
        ids_col = pc.cast(t.column(i), pa.string())
        tables.append(t.set_column(i, "trial_id", ids_col).filter(pc.is_in(ids_col, keep)))
    return tables[0], tables[1]


def runs_subset(runs: Runs, ids: list[str]) -> Runs:
    """The trials ``ids`` of ``runs`` (:func:`subset_tables`)."""
    return runs_from_tables(*subset_tables(runs, ids), source=runs.source)


UNIFORM = "uniform"  # the timestep sampler of a trial whose runs table names none


def samplers_of(runs: Runs) -> np.ndarray:
    """Each trial's sampler (``uniform`` where the runs table has no ``timestep_sampling`` or a null)."""
    if "timestep_sampling" not in runs.trials.column_names:
        return np.full(len(runs.trial_ids), UNIFORM, dtype=object)
    col = pc.cast(runs.trials.column("timestep_sampling"), pa.string()).to_pylist()
    return np.array([UNIFORM if v in (None, "", "None") else v for v in col], dtype=object)


def subset(runs: Runs, keep: np.ndarray) -> Runs:
    """The runs of the trials where ``keep`` is true (both tables filtered)."""
    trials = runs.trials.filter(pa.array(np.asarray(keep, bool)))
    ids = pa.array([t for t, k in zip(runs.trial_ids, keep, strict=True) if k], pa.string())
    metrics = runs.metrics.filter(pc.is_in(pc.cast(runs.metrics.column("trial_id"), pa.string()), value_set=ids))
    return Runs(trials, metrics, source=runs.source)


def is_branched(runs: Runs) -> bool:
    """True when ``trials.parquet`` has the branch columns and at least one branch row (a branched study)."""
    names = runs.trials.column_names
    return all(c in names for c in BRANCH_COLUMNS) and runs.trials.column(PARENT).null_count < runs.trials.num_rows
