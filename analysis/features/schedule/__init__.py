"""`bcrit schedule`: a batch-size schedule proposed from the per-stage answers."""
