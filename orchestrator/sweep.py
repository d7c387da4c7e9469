"""The sweep's Python API, for ``bcrit sweep`` and for users' own Tune scripts (see examples/sweep_script.py).

    spec = load_spec("examples/tiny.yaml")          # validated YAML (orchestrator.specs.sweep_spec)
    launch = prepare(spec)                           # Ray acquired, every trial checked, then a local Ray started
    tuner = build_tuner(spec, configs=launch.configs)  # Tuner: trainable, resources, search, callbacks
    results = run(tuner, spec)                       # fit; every MLflow run ends terminal
    results = run(restore_tuner(restore_spec(dir)), spec)  # continue an interrupted sweep

One concern per module, gathered here: `orchestrator.execution.launch` (the one launch path, as `bcrit sweep`
takes it), `orchestrator.execution.preflight` (validation before launch), `orchestrator.cluster.ray_start` and
`orchestrator.cluster.sizing` (acquiring Ray; what trials hold and need), `orchestrator.execution.tuner` (the Tuner,
restoring it, running it), `orchestrator.execution.sweep_state` (what a sweep directory holds, for resuming),
`orchestrator.cluster.ray_logs` (what the driver's terminal leaves out).
"""

from __future__ import annotations

import os
import time

from orchestrator.cluster.ray_logs import quiet_driver_logs
from orchestrator.cluster.ray_start import local_resources, start_ray
from orchestrator.cluster.sizing import local_cpus, max_concurrent, ray_cpus, trial_need
from orchestrator.execution.launch import Launch, prepare
from orchestrator.execution.preflight import check_spec
from orchestrator.execution.sweep_state import can_restore, restore_spec, sweep_state
from orchestrator.execution.tuner import build_tuner, callbacks, restore_tuner, run
from orchestrator.records.tracking_uri import check_tracking
from orchestrator.specs.sweep_spec import load_spec
from orchestrator.storage.layout import SPEC_FILE, TUNE_DIR
from orchestrator.storage.shared_dir import check_storage

__all__ = [
    "Launch",
    "prepare",
    "SPEC_FILE",
    "TUNE_DIR",
    "build_tuner",
    "callbacks",
    "can_restore",
    "check_spec",
    "check_storage",
    "check_tracking",
    "load_spec",
    "local_cpus",
    "local_resources",
    "max_concurrent",
    "quiet_driver_logs",
    "ray_cpus",
    "restore_spec",
    "restore_tuner",
    "run",
    "start_ray",
    "sweep",
    "sweep_state",
    "trial_need",
]


def sweep(path: str, overrides: list[str] | None = None, *, resume: bool = False, verbose: bool = False):
    """Load, validate, run (or resume) a sweep; returns (spec, ResultGrid, wall seconds)."""
    spec = restore_spec(path) if os.path.isdir(path) else load_spec(path, overrides)
    launch = prepare(spec, resume, verbose)  # as `bcrit sweep`: Ray acquired, trials checked, the directory's state
    t0 = time.perf_counter()
    tuner = (
        restore_tuner(spec, verbose=verbose)
        if launch.restore
        else build_tuner(spec, configs=launch.configs, verbose=verbose)
    )
    results = run(tuner, spec)
    return spec, results, time.perf_counter() - t0
