"""bcrit.orchestrator: Ray Tune sweeps of DiT trials, MLflow tracking, and the `bcrit` command line."""
