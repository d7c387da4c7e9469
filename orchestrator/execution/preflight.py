"""A sweep checked before anything launches: every trial config against the resources it will get, the storage
directory, the MLflow tracking URI. Each mistake is one `UserError` line naming the fix."""

from __future__ import annotations

import os
from typing import Any

from orchestrator.cluster import capacity  # looked up at call time: tests stand in a cluster's capacity
from orchestrator.cluster.sizing import trial_need, worker_bundle
from orchestrator.errors import UserError
from orchestrator.records.tracking_uri import check_tracking
from orchestrator.specs.sweep_spec import SweepSpec
from orchestrator.storage import shared_dir  # looked up at call time: tests stand in a one-node probe
from orchestrator.storage.shared_dir import check_storage
from orchestrator.storage.uri import probe
from trainables.config import ConfigError
from trainables.workloads import get_workload


def check_spec(spec: SweepSpec, resources: dict | None = None) -> list[dict[str, Any]]:
    """Validate everything before launch: each trial config (``from_dict`` + the workload's check against
    ``resources``, default what the connected cluster can hold: orchestrator.cluster.capacity.capacity, its autoscaler's
    node types included), storage and tracking. Returns the trial-config dicts (normalised by the config class).
    Raises UserError; nothing is launched."""
    check_storage(spec.sweep_dir)
    if spec.storage_uri:
        probe(spec.storage_uri)  # write and read back: a missing bucket, endpoint or credentials, one line
    check_tracking(spec.mlflow_uri)
    cap = None
    if resources is None:
        if not spec.storage_uri:  # a URI is what every node reaches; a directory must be shared (one line if not)
            shared_dir.check_shared_storage(spec.sweep_dir)
        cap = capacity.capacity()
    return check_trials(spec, resources, cap)


def check_trials(spec: SweepSpec, resources: dict | None, cap=None) -> list[dict[str, Any]]:
    """The trial part of `check_spec`, which writes nothing: each trial config against ``resources`` (this
    machine's local Ray), or with ``cap`` (orchestrator.cluster.capacity.Capacity) against what the cluster can hold.
    Returns the trial-config dicts (normalised by the config class). Raises UserError."""
    if cap is not None:
        resources, where = cap.total, cap.describe()
    else:
        assert resources is not None
        where = local_where(resources)
    w = get_workload(spec.workload)
    out, checked = [], set()
    for cfg in trial_configs(spec):
        d = cfg.to_dict()
        trial = _trial(d)
        if spec.adaptive is not None and spec.adaptive.bins:
            check_bins(w, cfg, spec.workload)
        need, bundle = trial_need(d), worker_bundle(d)
        if cap is not None and bundle and cap.nodes and not cap.fits_one_node(bundle):
            raise UserError(
                f"{trial}: one worker needs {_show(bundle)} on one node but no node type of {where} has that; "
                "lower cpus_per_worker, or add a node type that holds it"
            )
        for kind, n in need.items():
            if n > resources.get(kind, 0.0):
                raise UserError(
                    f"{trial} needs {n:g} {kind}s (1 Tune driver + {cfg.num_workers} workers x {cfg.cpus_per_worker})"
                    f" but {where} has {resources.get(kind, 0.0):g}; lower num_workers or cpus_per_worker, or set "
                    "RAY_ADDRESS to a bigger cluster"
                    if kind == "CPU" and cfg.num_workers
                    else f"{trial} needs {n:g} {kind}s but {where} has {resources.get(kind, 0.0):g}; lower its needs"
                )
        key = tuple(sorted((k, str(v)) for k, v in d.items() if k not in ("lr", "seed")))
        if key not in checked:
            try:
                w.check(cfg, resources)
            except (ConfigError, TypeError) as e:
                raise UserError(f"{trial}: {e}") from None
            checked.add(key)
        out.append(d)
    return out


def trial_configs(spec: SweepSpec) -> list:
    """The spec's trial configs through its workload's config class, its defaults filled in (what the trials
    receive, a setting's key in their rows); a config the class refuses is one UserError line naming the trial."""
    cls = get_workload(spec.workload).config_cls
    out = []
    for raw in spec.trial_configs():
        try:
            out.append(cls.from_dict(raw))
        except (ConfigError, TypeError) as e:
            raise UserError(f"{_trial(raw)}: {e}") from None
    return out


def _trial(c: dict) -> str:
    return f"trial B={c['batch_size']} split {c['micro_batch_size']}x{c['grad_accum']}x{c['num_workers']}"


def local_where(resources: dict) -> str:
    """This machine and the local Ray it plans, in words (for the lines that refuse or size trials)."""
    return (
        f"this machine ({os.cpu_count() or 1} cores, over-subscribed to {int(resources.get('CPU', 0))} logical "
        f"CPUs, {int(resources.get('GPU', 0))} GPUs)"
    )


def check_bins(w, cfg, name: str) -> None:
    """An adaptive sweep's ``goal.bins: true`` needs trials that report >= 2 per-timestep-bin eval losses."""
    n = None if w.eval_bins is None else w.eval_bins(cfg)
    if n is None:
        raise UserError(
            f"nuisance.goal.bins: true, but workload {name} does not say whether it reports per-timestep-bin eval "
            "losses (its Workload has no eval_bins); use bins: false"
        )
    if n < 2:
        what = "reports no per-timestep-bin eval loss" if n == 0 else "evaluates a single timestep bin"
        fix = " (set fixed.timestep_bins >= 2)" if n == 1 else ""
        raise UserError(f"nuisance.goal.bins: true, but workload {name} {what}; use bins: false{fix}")


def _show(bundle: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in bundle.items() if v)
