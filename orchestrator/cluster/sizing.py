"""What a sweep's trials hold and need in Ray (Ray Train V2), and the local Ray sized for them.

A trial with workers takes one CPU for its Tune driver; its workers get their own placement group from Train, so
the trial's own request must not include them (they would be reserved twice). `max_concurrent` keeps room for the
largest trial's workers next to the running drivers.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.specs.sweep_spec import SweepSpec


def trial_bundle(cfg: dict) -> dict[str, float]:
    """What the Tune trial itself holds: its driver (1 CPU), or the whole in-process worker."""
    if int(cfg.get("num_workers", 0)) == 0:
        return {"CPU": float(cfg.get("cpus_per_worker", 1)), **({"GPU": gpu_share(cfg)} if cfg.get("use_gpu") else {})}
    return {"CPU": 1.0}


def trial_need(cfg: dict) -> dict[str, float]:
    """Everything a trial uses while it runs (driver + Train workers)."""
    w = int(cfg.get("num_workers", 0))
    if w == 0:
        return trial_bundle(cfg)
    need = {"CPU": 1.0 + w * float(cfg.get("cpus_per_worker", 1))}
    if cfg.get("use_gpu"):
        need["GPU"] = w * gpu_share(cfg)
    for kind, n in worker_bundle_extra(gpu_share(cfg)).items():  # the accelerator-like test hook (trainables.trial)
        need[kind] = need.get(kind, 0.0) + w * n
    return need


def worker_bundle(cfg: dict) -> dict[str, float]:
    """One Train worker's request (what must fit on one node); empty for an in-process trial."""
    if int(cfg.get("num_workers", 0)) == 0:
        return {}
    out = {"CPU": float(cfg.get("cpus_per_worker", 1)), **({"GPU": gpu_share(cfg)} if cfg.get("use_gpu") else {})}
    for kind, n in worker_bundle_extra(gpu_share(cfg)).items():
        out[kind] = out.get(kind, 0.0) + n
    return out


def worker_bundle_extra(share: float = 1.0) -> dict[str, float]:
    # torch: deferred, the dry run (bcrit sweep --dry-run) loads this module
    from trainables.trial import extra_worker_resources

    return extra_worker_resources(share)


def gpu_share(cfg: dict) -> float:
    """The share of one GPU a worker (or an in-process trial) holds: ``gpus_per_worker``, 1 unless packed."""
    return float(cfg.get("gpus_per_worker", 1.0))


def max_concurrent(configs: list[dict], resources: dict) -> int:
    """Trials that can run at once without a worker group waiting on drivers: total / largest need."""
    worst = 1 << 30
    for kind in {k for c in configs for k in trial_need(c)}:
        need = max((trial_need(c).get(kind, 0.0) for c in configs), default=0.0)
        if need:
            worst = min(worst, math.floor(resources.get(kind, 0.0) / need))
    return max(1, worst)


def concurrency(configs: list[dict], resources: dict, search: str, cluster: bool) -> int:
    """Tune's ``max_concurrent_trials`` of a sweep: what ``resources`` hold (`max_concurrent`); an adaptive sweep on
    the embedded local Ray no more than compute at once on the cores (`compute_slots`): its refits choose each trial
    from the ones finished, and a local Ray's oversubscribed CPUs would only add trials chosen blind. On a cluster
    its capacity."""
    n = max_concurrent(configs, resources)
    return min(n, compute_slots(configs)) if search == "adaptive" and not cluster else n


def compute_slots(configs: list[dict]) -> int:
    """Trials whose training computes at once on this machine's cores: cores / the largest trial's training CPUs
    (an in-process trial's own, or its Train workers'; a Tune driver idles while its workers train). The embedded
    local Ray holds twice the cores (:func:`local_cpus`), so :func:`max_concurrent` runs up to twice this many,
    each slower: the same throughput. An adaptive sweep runs this many instead (`concurrency`): a trial
    started while others run is chosen without their results, so more trials in flight cost more of the grid's
    examples (benchmarks/RESULTS.md)."""
    need = 1.0
    for c in configs:
        w = int(c.get("num_workers", 0))
        need = max(need, trial_bundle(c)["CPU"] if w == 0 else w * worker_bundle(c)["CPU"])
    return max(1, math.floor((os.cpu_count() or 1) / need))


def local_cpus(spec: SweepSpec | None = None) -> int:
    """Logical CPUs of the embedded local Ray: this machine's cores over-subscribed twice (each Tune driver takes
    a CPU besides its workers: docs/design.md), at least 4. Not grown to fit the spec: a trial larger than the
    machine is refused by `check_spec` (say what the machine has), not run at a crawl."""
    return max(4, 2 * (os.cpu_count() or 1))


def ray_cpus(configs: list[dict]) -> int:
    """Logical CPUs for an embedded local Ray that runs these trials two at a time (`max_concurrent`): twice the
    largest trial's need, at least twice this machine's cores. On 2 cores a sweep with a 2-worker trial (1 driver +
    2 workers) gets 6, so two trials run at once -- one per core -- instead of one after the other."""
    biggest = max((trial_need(c)["CPU"] for c in configs), default=1.0)
    return int(max(2 * (os.cpu_count() or 1), 2 * biggest))
