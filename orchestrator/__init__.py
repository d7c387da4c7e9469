"""bcrit.orchestrator: Ray Tune sweeps of DiT trials, MLflow tracking, and the `bcrit` command line.

A house of sub-packages, each importing only those before it in this list, never one after it
(tests/test_code_shape.py enforces it; docs/architecture.md says what lives where):

    errors, faults  the one-line user error; fault injection for the kill tests
    storage/        the sweep directory's layout, local or at a URI; writable and shared-directory checks
    records/        MLflow tracking, the Parquet runs tables, terminal progress
    specs/          the YAML a user writes: overrides, the sweep, adaptive and branched-study specs
    cluster/        acquiring Ray, sizing trials against capacity, local multi-node clusters
    search/         the Optuna and the adaptive Tune searchers
    execution/      pre-launch checks, the one launch path, the Tuner, the trainable, branched studies
    sweep           the Python sweep API (examples/sweep_script.py)
    cli/            the `bcrit` command line, one module per sub-command"""
