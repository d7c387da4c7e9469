"""Acquiring Ray, the one way every command does it: join the cluster at ``RAY_ADDRESS`` (refused in one line, within
seconds, when it cannot be reached), or start a local Ray sized for the trials, quiet unless ``--verbose``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.cluster.capacity import capacity
from orchestrator.cluster.ray_address import check_ray_address
from orchestrator.cluster.ray_logs import filter_driver_logs
from orchestrator.cluster.sizing import local_cpus, ray_cpus
from orchestrator.errors import UserError

if TYPE_CHECKING:
    from orchestrator.specs.sweep_spec import SweepSpec


def on_cluster() -> bool:
    """Whether commands run against an existing cluster (``RAY_ADDRESS`` set) rather than a Ray of their own."""
    return bool(os.environ.get("RAY_ADDRESS"))


@dataclass(frozen=True)
class RayPlace:
    """Where a command's trials run, acquired by :func:`acquire_ray` before anything is validated: the cluster at
    ``RAY_ADDRESS`` (already joined) or a local Ray that :meth:`start` starts once the trials are checked."""

    cluster: bool
    verbose: bool = False

    def resources(self) -> dict[str, float] | None:
        """What trials are validated against: the cluster at its largest (its autoscaler's node types included),
        else None (the command's own default for this machine)."""
        return capacity().total if self.cluster else None

    def start(self, num_cpus: int) -> None:
        """Start the local Ray of ``num_cpus`` logical CPUs (nothing on a cluster: it was joined already)."""
        if not self.cluster:
            start_quiet_ray(num_cpus, self.verbose)


def acquire_ray(verbose: bool = False) -> RayPlace:
    """The one way ``sweep``, ``branch``, ``train`` and the Python sweep API acquire Ray: on a cluster
    (``RAY_ADDRESS``) join it now, so trials are checked against what it can hold; else plan a local Ray, started
    by :meth:`RayPlace.start` after the checks (no Ray is started for a spec that is refused)."""
    if on_cluster():
        connect(verbose)
        return RayPlace(cluster=True, verbose=verbose)
    return RayPlace(cluster=False, verbose=verbose)


def sweep_cpus(spec: SweepSpec, configs: list[dict]) -> int:
    """Logical CPUs of the local Ray a sweep starts: the machine's over-subscribed cores, or room for two of its
    largest trials at once (``configs``: its trial configs, checked)."""
    return max(local_cpus(spec), ray_cpus(configs))


def connect(verbose: bool = False) -> None:
    """Join the cluster at ``RAY_ADDRESS``; a cluster that cannot be reached (or refuses the token) is one
    UserError line naming the fix, not Ray's traceback or its minutes of retries."""
    # Ray: deferred, the dry run (bcrit sweep --dry-run) loads this module
    import ray

    if ray.is_initialized():
        return
    address = os.environ["RAY_ADDRESS"]
    check_ray_address(address)
    try:
        start_quiet_ray(1, verbose)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = (
            "; is the cluster running (`ray start --head`, `ray up cluster.yaml`)? Its head has token auth on "
            "(Ray's default): set RAY_AUTH_MODE=token"
            if os.environ.get("RAY_AUTH_MODE") != "token"
            else "; is the cluster running (`ray start --head`, `ray up cluster.yaml`)? Or unset RAY_ADDRESS"
        )
        raise UserError(f"RAY_ADDRESS={address}: cannot join the Ray cluster ({first}){hint}") from None


def local_resources(spec: SweepSpec) -> dict[str, float]:
    """What the embedded local Ray of a sweep will hold (to validate before starting it)."""
    # torch: deferred, the dry run (bcrit sweep --dry-run) loads this module
    import torch

    return {"CPU": float(local_cpus(spec)), "GPU": float(torch.cuda.device_count())}


def sweep_capacity() -> dict[str, float]:
    """The resources a started sweep's concurrency is sized for: on a cluster (``RAY_ADDRESS``) what it can hold at
    its largest (orchestrator.cluster.capacity: the autoscaler's node types), so trials start as nodes join; else the
    running Ray's own."""
    # Ray: deferred, the dry run (bcrit sweep --dry-run) loads this module
    import ray

    return capacity().total if on_cluster() else dict(ray.cluster_resources())


def start_quiet_ray(num_cpus: int, verbose: bool = False) -> None:
    """``RAY_ADDRESS`` if set, else a local Ray of ``num_cpus`` logical CPUs (trainables.trial.ensure_ray); without
    ``verbose``, Ray's known-harmless log lines are kept out of the terminal (orchestrator.cluster.ray_logs)."""
    # torch: deferred, the dry run (bcrit sweep --dry-run) loads this module
    from trainables.trial import ensure_ray

    ensure_ray(num_cpus=num_cpus, quiet=not verbose)
    if not verbose:
        filter_driver_logs()
