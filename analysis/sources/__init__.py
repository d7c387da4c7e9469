"""Where runs come from: the Parquet runs tables' schema, loading a sweep directory or an MLflow experiment into
``Runs``, and the MLflow tracking URI checks."""
