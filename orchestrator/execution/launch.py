"""Launching a sweep, the one way the CLI (``bcrit sweep``) and a script of your own (orchestrator.sweep) take: Ray
acquired (the cluster at ``RAY_ADDRESS`` joined, or a local Ray planned), every trial checked against what it will
get, the sweep directory's state decided (fresh, restored, or started again), and only then a local Ray started."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.cluster.ray_start import acquire_ray, local_resources, sweep_cpus
from orchestrator.errors import UserError
from orchestrator.execution.preflight import check_spec
from orchestrator.execution.sweep_state import (
    UNSTARTED,
    check_resumable_tracking,
    has_results,
    reset_unstarted,
    restores,
    sweep_state,
)
from orchestrator.specs.sweep_spec import SweepSpec
from orchestrator.storage.uri import Mirror


@dataclass(frozen=True)
class Launch:
    """A sweep ready to run: its validated trial configs, and whether Tune restores it (``Tuner.restore``)."""

    configs: list[dict]
    restore: bool


def prepare(spec: SweepSpec, resume: bool = False, verbose: bool = False) -> Launch:
    """Everything before the Tuner: validated before any trial starts, against the local Ray it would start or
    (joined first) what the cluster at RAY_ADDRESS can hold, its autoscaler's node types included."""
    place = acquire_ray(verbose)
    configs = check_spec(spec) if place.cluster else check_spec(spec, local_resources(spec))
    restore = plan_start(spec, resume)
    place.start(
        sweep_cpus(spec, configs)
    )  # a local Ray only now, after the checks (nothing on a cluster: joined already)
    return Launch(configs, restore)


def plan_start(spec, resume: bool) -> bool:
    """Decide, before Ray starts, how the sweep dir is used (`restores`' rule, which ``bcrit branch`` follows for
    each of its Tune experiments); returns whether to ``Tuner.restore``. A sweep killed before Tune's first state
    file is started again from scratch (its leftovers cleared); a fresh start is refused only for a directory
    holding a restorable sweep or results of an earlier one."""
    state = sweep_state(spec.sweep_dir, spec.storage_uri)
    if restores(state, resume, spec.sweep_dir):
        check_resumable_tracking(spec)
        return True
    if state == UNSTARTED:
        reset_unstarted(spec)
        return False
    if has_results(spec.sweep_dir):
        tune = f"{spec.storage_root}/tune" if not spec.storage_uri else spec.storage_uri + " (its tune/)"
        raise UserError(
            f"{spec.sweep_dir} holds results of an earlier sweep but no Tune state ({tune} is gone)"
            ", so it cannot be resumed; start the sweep in a new storage directory"
        )
    if resume:
        raise UserError(f"{spec.sweep_dir}: no interrupted sweep to resume; run it without --resume")
    return False


def mirror_at_end(spec) -> None:
    """A URI sweep's last push of its local directory to ``<URI>/bcrit/`` (also after Ctrl-C or a failure)."""
    if not spec.storage_uri:
        return
    try:
        n = Mirror(spec.storage_uri, spec.sweep_dir).push()
    except OSError as e:
        print(f"[bcrit] mirroring {spec.sweep_dir} to {spec.storage_uri} failed: {e}; rerun `bcrit sweep --resume`")
        return
    print(f"[bcrit] mirrored {spec.sweep_dir} -> {spec.layout.mirror}/ ({n} files updated)")
