"""Running a branched study (spec: orchestrator.specs.branch_spec) through Ray Tune (`run_study`, ``bcrit branch``).

1. the reference as one Tune trial (Tune experiment ``<dir>/reference``), keeping its checkpoints at the branch
   points in ``<dir>/reference_checkpoints/step<N>`` (trainables.branch_points);
2. every branch (point x k x seed) as one Tune trial (``<dir>/branches``) on the sweep's machinery: the same
   trainable (Ray Train workers when ``num_workers >= 1``), resources, MLflow tracking (one child run per trial
   under the study's parent run) and Parquet tables (with ``parent_trial_id``, ``branch_step``, ``k``).
Both phases resume (``--resume``) by a sweep's rule (`plan_study`): a finished reference is not trained again,
unfinished branches continue.
``bcrit analyze <dir>`` then gives the answer (analysis.features.branched.branch_report) with the settings saved here.
"""

from __future__ import annotations

import json
import os
import shutil

from analysis.core import metrics as M
from analysis.sources.schema import BRANCH_SETTINGS_FILE
from orchestrator.cluster.ray_start import acquire_ray, sweep_capacity
from orchestrator.cluster.sizing import max_concurrent, ray_cpus
from orchestrator.errors import UserError
from orchestrator.execution.sweep_state import (
    UNSTARTED,
    already_holds,
    has_results,
    restores,
    sweep_state,
)
from orchestrator.records.runs_tables import RunsTables, trial_row
from orchestrator.specs.branch_spec import (
    REFERENCE_ID,
    STUDY_FILE,
    BranchSpec,
    branch_checkpoint,
    check_branch_spec,
    load_branch_spec,
    parse_branch_spec,
)

__all__ = ["load_branch_spec", "parse_branch_spec", "run_study"]


EXTERNAL_ID = "external-reference"


def _external_reference(spec: BranchSpec, ref_cfg: dict) -> str:
    """The trial row of a reference trained elsewhere (``reference.checkpoints``): B0, lr and seed, no metrics."""
    RunsTables(spec.sweep_dir).write_trial(trial_row(EXTERNAL_ID, ref_cfg, M.STATUS_BUDGET_SPENT))
    return EXTERNAL_ID


def _save_study(spec: BranchSpec, ref_id: str | None = None) -> None:
    """The resolved spec (what --resume reads) and the analysis settings (what ``bcrit analyze`` reads)."""
    with open(os.path.join(spec.sweep_dir, STUDY_FILE), "w") as f:
        f.write(spec.to_yaml())
    settings = {
        "epsilons": list(spec.epsilons),
        "compare": spec.compare,
        "window": spec.window,
        "delta": spec.delta,
        "lr_rule": spec.lr_rule,
        "scale_by": spec.scale_by,
    }
    with open(os.path.join(spec.sweep_dir, BRANCH_SETTINGS_FILE), "w") as f:
        json.dump(settings, f, indent=1)
    if ref_id is not None:
        with open(os.path.join(spec.sweep_dir, REFERENCE_ID), "w") as f:
            f.write(ref_id + "\n")


# --- running: Ray Tune (bcrit branch) ---------------------------------------------------------------------------
REF_TUNE, BRANCH_TUNE = "reference", "branches"  # Tune experiments of the two phases, under the study dir


def _tuner(spec: BranchSpec, name: str, configs: list[dict], verbose: bool):
    """A grid Tuner over ``configs`` with the sweep's trainable, resources, callbacks (MLflow, tables) and retries."""
    # Ray: deferred, importing branch_study loads no Ray
    from ray import tune

    from orchestrator.execution.tuner import tuner_of

    return tuner_of(
        spec,
        {"trial": tune.grid_search(configs)},
        max_concurrent=max_concurrent(configs, sweep_capacity()),
        name=name,
        storage_path=spec.sweep_dir,
        total=len(configs),
        verbose=verbose,
    )


def started(study_dir: str) -> bool:
    """Whether the directory holds a study: its spec is saved first (`_save_study`), before any phase."""
    return os.path.exists(os.path.join(study_dir, STUDY_FILE))


def plan_study(spec: BranchSpec, resume: bool) -> dict[str, bool]:
    """Decide, before Ray starts, how each phase's Tune experiment is used, by a sweep's rule
    (orchestrator.execution.sweep_state.restores): phase -> whether to ``Tuner.restore`` it. A restorable one only
    with --resume; one killed before Tune's first state file has its Tune directory cleared and starts again (the
    records of a trial it had started are removed at the next driver's first step: orchestrator.records.lost_trials);
    one not begun yet starts. A fresh start is refused for a directory holding a study or results of an earlier run
    (a sweep's start over a sweep killed early also resets its MLflow parent: a study's has no such reset)."""
    if not resume and (started(spec.sweep_dir) or has_results(spec.sweep_dir)):
        raise already_holds(spec.sweep_dir, "branched study")
    plan = {}
    for name in (REF_TUNE, BRANCH_TUNE):
        state = sweep_state(spec.sweep_dir, name=name)
        plan[name] = restores(state, resume, spec.sweep_dir, "branched study", f"branched study's {name}")
        if state == UNSTARTED:
            shutil.rmtree(os.path.join(spec.sweep_dir, name))
    return plan


def _phase(spec: BranchSpec, name: str, configs: list[dict], restore: bool, verbose: bool = False):
    """Fit (or, when `plan_study` says so, restore and continue) one phase; returns the ResultGrid."""
    # Ray: deferred, importing branch_study loads no Ray
    from ray.tune import Tuner

    from orchestrator.execution.tuner import run, sweep_trainable

    if restore:
        path = os.path.join(spec.sweep_dir, name)
        tuner = Tuner.restore(path, trainable=sweep_trainable(spec, 3, verbose), resume_unfinished=True)
    else:
        tuner = _tuner(spec, name, configs, verbose)
    return run(tuner, spec)


def reference_id(sweep_dir: str) -> str | None:
    path = os.path.join(sweep_dir, REFERENCE_ID)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read().strip() or None


def run_study(spec: BranchSpec, resume: bool = False, verbose: bool = False) -> tuple[str, list]:
    """Both phases through Ray Tune. Returns (reference trial id, the branches' ResultGrid). ``verbose``: Ray's own
    INFO logs and Tune's tables (as ``bcrit sweep --verbose``)."""
    plan = plan_study(spec, resume)  # the directory read (and refused) before Ray is joined or started
    place = acquire_ray(verbose)  # validated against what the cluster can hold, or this machine
    ref_cfg, branch_cfgs = check_branch_spec(spec, place.resources())
    place.start(ray_cpus([ref_cfg, *branch_cfgs]))
    _save_study(spec)
    ref_id = reference_id(spec.sweep_dir) if resume else None
    if spec.checkpoints:
        ref_id = _external_reference(spec, ref_cfg)
    if ref_id is None:
        print(
            f"[bcrit] branched study {spec.name!r}: reference B0={spec.b0} lr={spec.lr0:g} to step {max(spec.points)}"
        )
        results = _phase(spec, REF_TUNE, [ref_cfg], plan[REF_TUNE], verbose)
        ref_id = results[0].metrics.get("trial_id") if len(results) else None
        status = RunsTables(spec.sweep_dir).trial_status(ref_id) if ref_id else None
        missing = [p for p in spec.points if not os.path.isdir(branch_checkpoint(spec.keep_dir, p))]
        if status != M.STATUS_BUDGET_SPENT or missing:
            raise UserError(
                f"the reference trial ended {status or 'without a result'} (kept checkpoints missing for steps "
                f"{missing}); lower reference.lr or the branch points and start a new study"
            )
        _save_study(spec, ref_id)
    configs = spec.branch_configs(ref_id)
    print(
        f"[bcrit] {len(configs)} branches: points {list(spec.points)} x k {[f'{k:g}' for k in spec.multipliers]} x "
        f"seeds {list(spec.seeds)}, {spec.delta} examples each ({spec.lr_rule} lr rule)"
    )
    results = _phase(spec, BRANCH_TUNE, configs, plan[BRANCH_TUNE], verbose)
    RunsTables(spec.sweep_dir).compact()
    return ref_id, results
