"""The demo spec's trials run in-process (no Ray, no MLflow), written to a sweep directory's Parquet tables with the
sweep's own writer (orchestrator.records.runs_tables), for tests of what the demo answers. Test helper, not a test
module.

The in-process trial is the loop the sweep runs for ``num_workers: 0`` (bit for bit on a CPU); 2-worker trials need
Ray Train and are left out (``in_process_only``): in the demo they are one split variant of one setting.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

from analysis.core import metrics as M
from analysis.sources.loaders import Runs, load_sweep_dir


def _run_one(cfg: dict) -> tuple[str, list]:
    import torch

    from trainables.config import TrialConfig
    from trainables.trial import run_local

    torch.set_num_threads(1)
    session = run_local(TrialConfig.from_dict(cfg))
    rows = [r for rep in session.reports for r in rep["rows"]]
    return session.reports[-1].get("status", M.STATUS_BUDGET_SPENT), rows


def run_in_process(configs: list[dict], sweep_dir: str, processes: int = 2) -> Runs:
    """Run every config with ``num_workers: 0`` in ``processes`` spawned processes; return the sweep's runs."""
    from orchestrator.records.runs_tables import RunsTables, trial_row

    configs = [c for c in configs if int(c.get("num_workers", 0)) == 0]
    with ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as pool:
        results = list(pool.map(_run_one, configs))
    tables = RunsTables(sweep_dir)
    for i, (cfg, (status, rows)) in enumerate(zip(configs, results, strict=True)):
        tid = f"t{i:04d}"
        tables.write_trial(trial_row(tid, cfg, status))
        tables.add_rows(tid, rows)
    tables.compact()
    return load_sweep_dir(sweep_dir)
