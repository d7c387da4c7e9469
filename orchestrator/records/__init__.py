"""What a sweep records as it runs: MLflow runs, the Parquet runs tables, the terminal's progress, and the cleanup of
trials lost with a killed driver."""
