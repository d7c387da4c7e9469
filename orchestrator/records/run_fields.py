"""What each MLflow run of a sweep carries besides the raw metrics (orchestrator.records.mlflow_tracking writes them).

Child run (one per trial):
- numeric copies of the scientific variables as metrics at step 0 (`analysis.core.metrics.SCIENTIFIC`), so the runs
  table sorts ``batch_size`` as a number and charts can put it on an axis (params are strings in MLflow);
- ``examples`` and ``wall_time`` at every reported step, each metric stamped with the true time of its
  measurement (the row's own clock when the trainable gives one, else derived from the report's time);
- the outcome when the target is reached: ``steps_to_target``, ``examples_to_target``, ``seconds_to_target``;
- tags: ``status`` (final), ``bcrit.trial_dir`` (the Tune trial directory), ``bcrit.checkpoint`` (latest),
  the git commit of the code (``mlflow.source.git.commit``), a description (``mlflow.note.content``);
- the dataset as an MLflow input (``log_inputs``, context ``train``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import subprocess
from collections.abc import Iterable
from typing import Any

from analysis.core import metrics as M
from orchestrator.records.runs_tables import trial_row

TAG_TRIAL_DIR = "bcrit.trial_dir"
TAG_CHECKPOINT = "bcrit.checkpoint"
TAG_GIT_COMMIT = "mlflow.source.git.commit"  # MLflow's own tag: the UI shows it on the run page
TAG_GIT_DIRTY = "bcrit.git_dirty"
TAG_DESCRIPTION = "mlflow.note.content"  # the run's description in the UI (markdown)
ARTIFACTS_DIR = "mlartifacts"
# MLflow 3's UI opens an experiment by its kind: without this tag, on the GenAI traces overview, not the runs table
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


def numeric_copies(cfg: dict) -> dict[str, float]:
    """``batch_size``, ``micro_batch_size``, ``grad_accum``, ``num_workers`` (world size), ``lr`` as floats,
    with the same values as ``trials.parquet`` (orchestrator.records.runs_tables.trial_row)."""
    row = trial_row("", cfg, M.STATUS_RUNNING)
    return {k: float(row[k]) for k in M.SCIENTIFIC}


def outcome(result: dict) -> dict[str, float]:
    """Steps, examples and training seconds to the target of a trial that reached it; ``{}`` otherwise."""
    if result.get("status") != M.STATUS_REACHED_TARGET or result.get(M.STEP) is None:
        return {}
    out = {M.STEPS_TO_TARGET: float(result[M.STEP])}
    if result.get(M.EXAMPLES) is not None:
        out[M.EXAMPLES_TO_TARGET] = float(result[M.EXAMPLES])
    if result.get("train_seconds") is not None:
        out[M.SECONDS_TO_TARGET] = float(result["train_seconds"])
    return out


def row_times_ms(rows: list, result: dict, fallback_ms: int) -> list[int]:
    """Epoch milliseconds at which each row ``[step, examples, metric, value, wall_time(, unix_time)]`` was
    measured: its own ``unix_time`` when present, else the report's time (Tune's ``timestamp``) minus the training
    seconds between the row and the report."""
    report_s = result.get("timestamp")
    report_train = result.get("train_seconds")
    out = []
    for r in rows:
        if len(r) > 5 and r[5] is not None:
            out.append(int(float(r[5]) * 1000))
        elif report_s is not None and report_train is not None:
            out.append(int((float(report_s) - (float(report_train) - float(r[4]))) * 1000))
        else:
            out.append(fallback_ms)
    return out


def step_groups(rows: list, times_ms: list[int]) -> list[tuple[int, list[tuple[str, float, int]]]]:
    """Rows grouped by step (ascending): ``(step, [(metric, value, ms), ...])`` with ``examples`` and
    ``wall_time`` added once per step (at the step's latest measurement time)."""
    by_step: dict[int, list] = {}
    extra: dict[int, tuple[float, float, int]] = {}
    for r, ms in zip(rows, times_ms, strict=True):
        step = int(r[0])
        by_step.setdefault(step, []).append((str(r[2]), float(r[3]), ms))
        ex, wall, t = extra.get(step, (float(r[1]), float(r[4]), ms))
        extra[step] = (float(r[1]), max(wall, float(r[4])), max(t, ms))
    out = []
    for step in sorted(by_step):
        ex, wall, t = extra[step]
        out.append((step, [*by_step[step], (M.EXAMPLES, ex, t), (M.WALL_TIME, wall, t)]))
    return out


def checkpoint_path(trial_dir: str | None, result: dict) -> str | None:
    """The checkpoint a result came with: Train's path (``checkpoint_path``, DDP trials) or the Tune trial's
    ``checkpoint_dir_name`` inside its directory (in-process trials)."""
    if result.get("checkpoint_path"):
        return str(result["checkpoint_path"])
    if result.get("checkpoint_dir_name") and trial_dir:
        return os.path.join(trial_dir, str(result["checkpoint_dir_name"]))
    return None


# --- code and data -------------------------------------------------------------------------------------------------
@functools.cache
def git_state() -> tuple[str | None, bool]:
    """(commit, dirty) of the checkout the bcrit code runs from; (None, False) outside a git checkout."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        sha = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, False
    return (sha or None), bool(dirty)


def code_tags() -> dict[str, str]:
    sha, dirty = git_state()
    return {TAG_GIT_COMMIT: sha, TAG_GIT_DIRTY: str(dirty).lower()} if sha else {}


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _shipped_file(name: str) -> str | None:
    spec = importlib.util.find_spec("trainables")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", f"{name}.npz")
    return path if os.path.exists(path) else None


def dataset_entity(cfg: dict):
    """The trial's training data as an ``mlflow.entities.Dataset`` (no data is loaded): the shipped ``digits``
    file (digest of its bytes), a latent folder (digest of path and eval split), or the noisy quadratic
    problem (digest of its parameters)."""
    # MLflow: deferred, importing run_fields loads no MLflow
    from mlflow.entities import Dataset

    if "dataset" in cfg:
        name, eval_size = str(cfg["dataset"]), cfg.get("eval_size")
        shipped = _shipped_file(name)
        if shipped:
            with open(shipped, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()[:16]
            return Dataset(name, digest, "local", json.dumps({"uri": shipped, "eval_size": eval_size}))
        path = os.path.abspath(name)
        return Dataset(os.path.basename(path.rstrip("/")) or name, _digest(path, eval_size), "local",
                       json.dumps({"uri": path, "eval_size": eval_size}))  # fmt: skip
    if "dim" in cfg:  # the noisy quadratic model: examples are drawn fresh from the problem
        problem = {k: cfg.get(k) for k in ("dim", "h_decay", "noise_scale", "theta0")}
        return Dataset("noisy-quadratic", _digest(problem), "code", json.dumps({"problem": problem}))
    return None


def dataset_inputs(cfg: dict) -> list:
    # MLflow: deferred, importing run_fields loads no MLflow
    from mlflow.entities import DatasetInput, InputTag

    ds = dataset_entity(cfg)
    return [] if ds is None else [DatasetInput(ds, [InputTag("mlflow.data.context", "train")])]


def child_description(trial_id: str, cfg: dict, sweep_name: str, trial_dir: str | None) -> str:
    w = max(1, int(cfg.get("num_workers", 0)))
    target = cfg.get("target_loss")
    goal = f"target eval/loss <= {target}" if target is not None else "no target"
    lines = [
        f"Trial `{trial_id}` of sweep **{sweep_name}**: batch size **{cfg['batch_size']}** = "
        f"{cfg['micro_batch_size']} x A{cfg.get('grad_accum')} x W{w}, lr {cfg['lr']:.3g}, seed {cfg.get('seed', 0)}.",
        f"Stops at the {goal} or after {cfg.get('max_steps')} steps. "
        f"Outcome: tag `status`, metrics `{M.STEPS_TO_TARGET}` / `{M.EXAMPLES_TO_TARGET}` / `{M.SECONDS_TO_TARGET}`.",
    ]
    if trial_dir:
        lines.append(f"Tune trial directory: `{trial_dir}`")
    return "\n\n".join(lines)


def parent_description(sweep_name: str, sweep_dir: str, spec: dict) -> str:
    sci = spec.get("scientific", {}) if isinstance(spec, dict) else {}
    return (
        f"Sweep **{sweep_name}** ({spec.get('workload', '?')}), batch sizes {sci.get('batch_sizes')}; "
        f"sweep directory `{sweep_dir}`. Child runs: one per trial. "
        f"Run `bcrit analyze {sweep_dir} --out {os.path.join(sweep_dir, 'analysis')}` to add B_crit here."
    )


def artifact_location(tracking_uri: str, sweep_dir: str, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside its SQLite store (the embedded store lives in the sweep
    directory, so copying the directory keeps them), ``None`` (the server decides) for a tracking server."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db_dir = os.path.dirname(os.path.abspath(tracking_uri[len("sqlite:///") :]))
    if db_dir == os.path.abspath(sweep_dir):
        return os.path.join(db_dir, ARTIFACTS_DIR)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in experiment)
    return os.path.join(db_dir, ARTIFACTS_DIR, safe)


def metric_entities(values: Iterable[tuple[str, float, int, int]]) -> list:
    """``(name, value, ms, step)`` tuples as ``mlflow.entities.Metric``."""
    # MLflow: deferred, importing run_fields loads no MLflow
    from mlflow.entities import Metric

    return [Metric(name, float(v), int(ms), int(step)) for name, v, ms, step in values]
