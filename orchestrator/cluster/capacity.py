"""A Ray cluster reached through ``RAY_ADDRESS``: connecting to it (one line when that fails) and what it **can**
hold, which is what trials are validated against and what a sweep's concurrency is sized for.

An autoscaling cluster (``ray up cluster.yaml``: GPU workers from 0) has no GPU at launch, so its resources of the
moment say nothing about what a trial may ask. Its largest size comes from its autoscaler's node types, read in this
order: the cluster config the autoscaler reports to the GCS (``ray._private.state.state.get_cluster_config``, set
by KubeRay and autoscaler v2), else an autoscaler YAML -- ``BCRIT_CLUSTER_CONFIG`` if set, else
``~/ray_bootstrap_config.yaml``, the copy of ``cluster.yaml`` that ``ray up`` leaves on the head, where the sweep
driver runs. Without any, the cluster's present resources are all it can hold (a fixed cluster).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import yaml

from orchestrator.errors import UserError

CONFIG_ENV = "BCRIT_CLUSTER_CONFIG"
BOOTSTRAP = "~/ray_bootstrap_config.yaml"


@dataclass
class Capacity:
    """``total``: the most of each resource the cluster can have at once; ``nodes``: each node type's (or live
    node's) resources, one worker bundle must fit on one of them; ``source``: where the node types came from."""

    total: dict[str, float]
    nodes: list[dict[str, float]] = field(default_factory=list)
    source: str = "its nodes now"

    def describe(self) -> str:
        return (
            f"the Ray cluster at its largest ({int(self.total.get('CPU', 0))} CPUs, {int(self.total.get('GPU', 0))}"
            f" GPUs; from {self.source})"
        )

    def fits_one_node(self, bundle: dict[str, float]) -> bool:
        return any(all(n.get(k, 0.0) >= v for k, v in bundle.items() if v) for n in self.nodes)


def capacity() -> Capacity:
    """What the connected cluster can hold: its live nodes, grown by its autoscaler's node types if any."""
    # Ray: deferred, the dry run (bcrit sweep --dry-run) loads this module
    import ray

    if not ray.is_initialized():  # Ray's state API would join whatever /tmp/ray/ray_current_cluster names, stale too
        raise RuntimeError("capacity needs a connected Ray (connect) first")

    live = [
        {k: float(v) for k, v in n["Resources"].items() if not k.startswith("node:")} for n in ray.nodes() if n["Alive"]
    ]
    now = {k: float(v) for k, v in ray.cluster_resources().items()}
    return combine(now, live, _reported_node_types() or _config_node_types())


def combine(now: dict[str, float], live: list[dict[str, float]], types) -> Capacity:
    """The cluster's resources ``now`` and ``live`` nodes grown by its node ``types`` ((source, [(resources, most
    nodes)]) or None): each resource at the larger of now and every type at its most."""
    if types is None:
        return Capacity(now, live)
    source, node_types = types
    most: dict[str, float] = {}
    for resources, count in node_types:
        for k, v in resources.items():
            most[k] = most.get(k, 0.0) + v * count
    total = {k: max(now.get(k, 0.0), most.get(k, 0.0)) for k in {*now, *most}}
    return Capacity(total, live + [r for r, count in node_types if count], source)


def _reported_node_types() -> tuple[str, list[tuple[dict[str, float], int]]] | None:
    """Node groups the autoscaler reported to the GCS (resources, most nodes), or None."""
    try:
        # Ray: deferred, the dry run (bcrit sweep --dry-run) loads this module
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # private API: its absence or a change only loses this source
        return None
    if config is None or not config.node_group_configs:
        return None
    groups = [({k: float(v) for k, v in g.resources.items()}, int(g.max_count)) for g in config.node_group_configs]
    return "the autoscaler's node types (GCS)", [(r, c if c >= 0 else 1 << 20) for r, c in groups]


def _config_node_types(path: str | None = None) -> tuple[str, list[tuple[dict[str, float], int]]] | None:
    """``available_node_types`` of an autoscaler YAML: each type's ``resources`` and most nodes (the head type
    once; a worker type at most its ``max_workers`` and the cluster's). None without a readable file."""
    path = path or os.environ.get(CONFIG_ENV) or os.path.expanduser(BOOTSTRAP)
    explicit = bool(os.environ.get(CONFIG_ENV))
    try:
        with open(path) as f:
            config = yaml.safe_load(f)  # as Ray's autoscaler reads it (YAML 1.1), not as bcrit reads specs
    except (OSError, yaml.YAMLError) as e:
        if explicit:
            raise UserError(f"{CONFIG_ENV}={path}: cannot read the cluster config ({e}); fix or unset it") from None
        return None
    types = (config or {}).get("available_node_types") if isinstance(config, dict) else None
    if not isinstance(types, dict):
        if explicit:
            raise UserError(f"{CONFIG_ENV}={path}: no available_node_types; point it at the cluster's YAML")
        return None
    cap = int(config.get("max_workers", 1 << 20))
    out = []
    for name, t in types.items():
        resources = {k: float(v) for k, v in (t.get("resources") or {}).items()}
        most = 1 if name == config.get("head_node_type") else min(int(t.get("max_workers", cap)), cap)
        out.append((resources, most))
    return f"the node types of {path}", out
