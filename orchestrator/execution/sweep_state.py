"""What a sweep directory holds, read before Ray starts: a Tune experiment to restore (or one killed before its
first state file), results of an earlier sweep, the spec it was started with and its MLflow parent run; and the rule
``--resume`` follows for each Tune experiment (`restores`). A branched study's directory is read the same way, its two
Tune experiments (``reference``, ``branches``) each as a sweep's one (orchestrator.features.branched.branch_study)."""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import json
import os
import shutil

from analysis.sources.mlflow_uri import sqlite_path
from orchestrator.errors import UserError
from orchestrator.specs.sweep_spec import SweepSpec, parse_spec
from orchestrator.specs.yaml_overrides import load_yaml
from orchestrator.storage.layout import BCRIT_FILES, PARENT_FILE, PARTS, SPEC_FILE, TRAIN_DIR, TUNE_DIR
from orchestrator.storage.uri import Mirror, exists, glob_names, remove_dirs

NO_SWEEP, UNSTARTED, RESTORABLE = "none", "unstarted", "restorable"


def sweep_state(sweep_dir: str, storage_uri: str | None = None, name: str = TUNE_DIR) -> str:
    """`RESTORABLE`: Tune saved its experiment state (``Tuner.restore`` works); `UNSTARTED`: the driver died
    after writing ``tuner.pkl`` but before Tune's first ``experiment_state-*.json`` (``Tuner.can_restore`` says
    yes, then ``Tuner.restore`` fails with ``KeyError: 'trial'``); `NO_SWEEP`: no Tune experiment at all.
    Tune's experiment ``name`` (a sweep's ``tune``) is read at ``storage_uri`` when the sweep's storage is a URI."""
    if storage_uri:
        if not exists(storage_uri, name, "tuner.pkl"):
            return NO_SWEEP
        names = glob_names(storage_uri, name)
        return RESTORABLE if any(fnmatch.fnmatch(n, "experiment_state-*.json") for n in names) else UNSTARTED
    tune_dir = os.path.join(os.path.abspath(sweep_dir), name)
    if not os.path.isfile(os.path.join(tune_dir, "tuner.pkl")):
        return NO_SWEEP
    if glob.glob(os.path.join(tune_dir, "experiment_state-*.json")):
        return RESTORABLE
    return UNSTARTED


def can_restore(sweep_dir: str, storage_uri: str | None = None) -> bool:
    return sweep_state(sweep_dir, storage_uri) == RESTORABLE


def restores(state: str, resume: bool, where: str, what: str = "sweep", part: str | None = None) -> bool:
    """``--resume``'s rule for one Tune experiment in ``state`` (`sweep_state`) of the directory ``where``, decided
    before Ray starts; whether to ``Tuner.restore`` it. A restorable one only with ``--resume`` (else UserError: the
    directory already holds a ``what``); one killed before Tune's first state file is started again from scratch
    (said here; its caller clears what it left: ``part``, default ``what``); none: started."""
    if state == RESTORABLE:
        if not resume:
            raise already_holds(where, what)
        return True
    if state == UNSTARTED:
        print(
            f"[bcrit] {where}: the {part or what} was stopped before Tune saved its first state; starting it again "
            "from scratch"
        )
    return False


def already_holds(where: str, what: str = "sweep") -> UserError:
    return UserError(f"{where} already holds a {what}; add --resume to continue it, or set storage to a new directory")


def has_results(sweep_dir: str) -> bool:
    """Metric rows of an earlier sweep in the directory (the tables or their parts)."""
    d = os.path.abspath(sweep_dir)
    return bool(glob.glob(os.path.join(d, "parts", "*", "m-*.parquet"))) or os.path.exists(
        os.path.join(d, "metrics.parquet")
    )


def reset_unstarted(spec: SweepSpec) -> None:
    """Clear what a sweep killed before Tune's first state file left behind -- Tune and Train directories, table
    parts and tables, the searchers' files (Optuna's journal, the adaptive decisions), and the child runs under the
    MLflow parent (the parent itself is kept and adopted) -- so that it starts again from scratch with nothing stale
    mixed in. For a URI sweep also at ``<URI>/bcrit/`` (else a pull would bring them back)."""
    d = spec.sweep_dir
    for sub in (TUNE_DIR, TRAIN_DIR, PARTS):
        shutil.rmtree(os.path.join(d, sub), ignore_errors=True)
    files = BCRIT_FILES
    for name in files:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(d, name))
    if spec.storage_uri:
        remove_dirs(spec.storage_uri, TUNE_DIR, TRAIN_DIR)
        mirror = Mirror(spec.storage_uri, d)
        for prefix in (f"{TUNE_DIR}/", f"{TRAIN_DIR}/", f"{PARTS}/", *files):
            mirror.remove(prefix)
    parent = recorded_parent(spec)
    if parent:
        # MLflow: deferred, the dry run (bcrit sweep --dry-run) loads this module
        from mlflow.tracking import MlflowClient

        from orchestrator.records.mlflow_tracking import quiet_end  # Ray's Callback: deferred as mlflow is

        client = MlflowClient(spec.mlflow_uri)
        exp = client.get_run(parent).info.experiment_id
        for run in client.search_runs([exp], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'"):
            client.delete_run(run.info.run_id)
        if _saved_spec_text(d) != spec.to_yaml():
            # another spec starts here: the old parent (its params are the old spec's) ends; a new one is made
            quiet_end(client, parent, "KILLED")
            os.remove(os.path.join(d, PARENT_FILE))


def _saved_spec_text(sweep_dir: str) -> str | None:
    try:
        with open(os.path.join(sweep_dir, SPEC_FILE)) as f:
            return f.read()
    except OSError:
        return None


def recorded_parent(spec: SweepSpec) -> str | None:
    """The MLflow parent run id the sweep dir recorded for the spec's tracking URI (None: none yet)."""
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
    # MLflow: deferred, the dry run (bcrit sweep --dry-run) loads this module
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(spec.mlflow_uri).get_run(parent)
    except MlflowException:
        raise UserError(f"the sweep's MLflow parent run {parent} is not in {spec.mlflow_uri}; {fix}") from None


def restore_spec(sweep_dir: str, name: str = SPEC_FILE, parse=parse_spec, what: str = "sweep"):
    """The spec an existing sweep dir was started with: its file ``name``, read by ``parse`` (a branched study's:
    ``STUDY_FILE``, ``parse_branch_spec``, "branched study")."""
    path = os.path.join(os.path.abspath(sweep_dir), name)
    kept = " (it is also an artifact of the sweep's MLflow parent run)" if name == SPEC_FILE else ""
    if not os.path.exists(path):
        raise UserError(f"{sweep_dir}: not a bcrit {what} directory (no {name}); pass the spec YAML instead")
    try:
        return parse(load_yaml(path, allow_empty=False), sweep_dir=sweep_dir, source=path)
    except UserError as e:
        raise UserError(
            f"{e} -- {name} is the spec this {what} was started with; restore it{kept} or start the {what} again "
            "in a new storage directory"
        ) from None
