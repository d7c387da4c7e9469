"""The sweep's Python API, for ``bcrit sweep`` and for users' own Tune scripts (see examples/sweep_script.py).

    spec = load_spec("examples/tiny.yaml")          # validated YAML (orchestrator.spec)
    check_spec(spec)                                 # every trial config + resources, storage, tracking
    tuner = build_tuner(spec)                        # Tuner: trainable, resources, search, callbacks
    results = run(tuner, spec)                       # fit; every MLflow run ends terminal
    results = run(restore_tuner(restore_spec(dir)), spec)  # continue an interrupted sweep

One concern per module, gathered here: `orchestrator.sweep_checks` (validation before launch),
`orchestrator.resources` (what trials hold and need; the local Ray), `orchestrator.tuner` (the Tuner, restoring
it, running it), `orchestrator.sweep_state` (what a sweep directory holds, for resuming),
`orchestrator.ray_logs` (what the driver's terminal leaves out).
"""

from __future__ import annotations

import os
import time

from orchestrator.ray_logs import quiet_driver_logs
from orchestrator.resources import local_cpus, local_resources, max_concurrent, ray_cpus, start_ray, trial_need
from orchestrator.spec import SPEC_FILE, load_spec
from orchestrator.sweep_checks import check_spec, check_storage, check_tracking
from orchestrator.sweep_state import TUNE_DIR, can_restore, restore_spec, sweep_state
from orchestrator.tuner import build_tuner, callbacks, restore_tuner, run

__all__ = [
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
    start_ray(spec, verbose)
    t0 = time.perf_counter()
    tuner = restore_tuner(spec, verbose=verbose) if resume else build_tuner(spec, verbose=verbose)
    results = run(tuner, spec)
    return spec, results, time.perf_counter() - t0
