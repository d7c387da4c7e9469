"""Runs written as a sweep directory, so that tests and benchmarks can hand a simulated sweep to the commands
(``bcrit analyze SWEEP_DIR`` and the others read what a sweep writes: its trials and metrics tables)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from analysis.sources.loaders import Runs
from analysis.sources.schema import METRICS_FILE, TRIALS_FILE


def write_sweep_dir(runs: Runs, path: str | Path) -> None:
    """Write ``runs`` as a sweep directory (the inverse of :func:`analysis.sources.loaders.load_sweep_dir`)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(runs.trials, root / TRIALS_FILE)
    pq.write_table(runs.metrics, root / METRICS_FILE)
