"""The sweep's Python API, for ``bcrit sweep`` and for users' own Tune scripts (see examples/sweep_script.py).

    spec = load_spec("examples/tiny.yaml")          # validated YAML (orchestrator.specs.sweep_spec)
    launch = prepare(spec)                           # Ray acquired, every trial checked, then a local Ray started
    tuner = build_tuner(spec, configs=launch.configs)  # Tuner: trainable, resources, search, callbacks
    results = run(tuner, spec)                       # fit; every MLflow run ends terminal
    results = run(restore_tuner(restore_spec(dir)), spec)  # continue an interrupted sweep
    spec, results, wall_s = sweep("examples/tiny.yaml", ["storage=s3://b/p"])  # all of it, as `bcrit sweep` does

One concern per module, gathered here: `orchestrator.execution.run_sweep` (the one sweep path, `bcrit sweep`'s:
the spec opened, a URI sweep fetched, launched, run, mirrored back), `orchestrator.execution.launch` (its launch),
`orchestrator.execution.preflight` (validation before launch), `orchestrator.cluster.ray_start` and
`orchestrator.cluster.sizing` (acquiring Ray; what trials hold and need), `orchestrator.execution.tuner` (the Tuner,
restoring it, running it), `orchestrator.execution.sweep_state` (what a sweep directory holds, for resuming),
`orchestrator.cluster.ray_logs` (what the driver's terminal leaves out).
"""

from __future__ import annotations

from orchestrator.cluster.ray_logs import quiet_driver_logs
from orchestrator.cluster.ray_start import local_resources
from orchestrator.cluster.sizing import local_cpus, max_concurrent, ray_cpus, trial_need
from orchestrator.execution.launch import Launch, prepare
from orchestrator.execution.preflight import check_spec
from orchestrator.execution.run_sweep import SweepRun, fetch_sweep, open_spec, run_sweep
from orchestrator.execution.sweep_state import can_restore, restore_spec, sweep_state
from orchestrator.execution.tuner import build_tuner, callbacks, restore_tuner, run
from orchestrator.records.tracking_uri import check_tracking
from orchestrator.specs.sweep_spec import SweepSpec, load_spec
from orchestrator.storage.layout import SPEC_FILE, TUNE_DIR
from orchestrator.storage.shared_dir import check_storage

__all__ = [
    "Launch",
    "prepare",
    "SweepRun",
    "open_spec",
    "run_sweep",
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
    "sweep",
    "sweep_state",
    "trial_need",
]


def sweep(
    path: str | SweepSpec,
    overrides: list[str] | None = None,
    *,
    resume: bool = False,
    verbose: bool = False,
    extra_callbacks: list | tuple = (),
):
    """Run (or with ``resume`` continue) a sweep the way ``bcrit sweep`` does (orchestrator.execution.run_sweep):
    ``path`` a spec YAML (``overrides`` as ``--set``), a sweep directory or storage URI to resume, or a spec already
    loaded; a URI sweep is fetched from ``<URI>/bcrit/`` first and pushed back at the end. ``extra_callbacks``: your
    own Tune callbacks (a new sweep's). Returns (spec, ResultGrid, wall seconds)."""
    if isinstance(path, SweepSpec):
        spec = path
        fetch_sweep(spec)
    else:
        spec = open_spec(path, overrides, resume)
    done = run_sweep(spec, resume, verbose, extra_callbacks=extra_callbacks)
    return done.spec, done.results, done.wall_s
