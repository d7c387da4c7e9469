"""Benchmark ``bcrit analyze``'s core on 10,000 trials × 1,000 evaluations (synthetic); target ≤ 5 s.

Run: ``.venv/bin/python benchmarks/bench_analyze.py [--trials 10000] [--evals 1000] [--bootstrap 1000]``.
Prints seconds for: writing the sweep (not timed against the target), loading + validating the Parquet
files, ``analyze`` without plots, and ``analyze`` with plots; and the ratio of load + analyze to 5 s.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.core import metrics as m
from analysis.reporting.report import analyze
from analysis.sources.loaders import load_sweep_dir
from analysis.sources.schema import METRICS_FILE, METRICS_SCHEMA, TRIALS_FILE, trials_table

TARGET_S = 5.0


def write_synthetic(root: Path, n_trials: int, n_evals: int, seed: int = 0) -> None:
    """A sweep over 10 batch sizes: ``L = 0.1 + 0.9/(1 + s/tau)``, ``tau = S(B)·penalty(lr)·noise``."""
    rng = np.random.default_rng(seed)
    bs = 2 ** (4 + np.arange(n_trials) % 10)  # 16 .. 8192
    lr_f = 2.0 ** rng.uniform(-2, 2, n_trials)
    tau = (200 + 51200 / bs) * (1 + 0.3 * np.log2(lr_f) ** 2) * rng.lognormal(0, 0.1, n_trials)
    every = np.maximum(1, np.round(9 * (200 + 51200 / bs) / n_evals)).astype(np.int64)
    step = every[:, None] * np.arange(n_evals)[None, :]  # (n, E)
    loss = 0.1 + 0.9 / (1 + step / tau[:, None])
    diverged = lr_f > 3.5
    loss[diverged, n_evals // 2 :] = np.nan
    ids = np.array([f"trial_{i:05d}" for i in range(n_trials)])
    status = np.where(diverged, m.STATUS_DIVERGED, m.STATUS_BUDGET_SPENT)
    ones = np.ones(n_trials, np.int64)
    trials = trials_table(
        {
            "trial_id": ids, "batch_size": bs.astype(np.int64), "micro_batch_size": bs.astype(np.int64),
            "grad_accum": ones, "num_workers": ones, "lr": 1e-3 * lr_f, "seed": 0 * ones, "status": status,
        }
    )  # fmt: skip
    metric = pa.DictionaryArray.from_arrays(np.zeros(step.size, np.int32), pa.array([m.EVAL_LOSS]))
    metrics = pa.table(
        {
            "trial_id": pa.array(np.repeat(ids, n_evals)), "step": step.ravel(),
            "examples": (step * bs[:, None]).ravel(), "metric": metric.cast(pa.string()), "value": loss.ravel(),
        },
        schema=METRICS_SCHEMA,
    )  # fmt: skip
    pq.write_table(trials, root / TRIALS_FILE)
    pq.write_table(metrics, root / METRICS_FILE)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--trials", type=int, default=10_000)
    p.add_argument("--evals", type=int, default=1_000)
    p.add_argument("--bootstrap", type=int, default=1_000)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        write_synthetic(root, a.trials, a.evals)
        t_write = time.perf_counter() - t0
        t0, c0 = time.perf_counter(), time.process_time()
        runs = load_sweep_dir(root)
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = analyze(runs, bootstrap=a.bootstrap, out_dir=root / "out_noplots", plots=False)
        t_core = time.perf_counter() - t0
        cpu = time.process_time() - c0  # CPU seconds of load + analyze: robust to a busy machine
        runs = load_sweep_dir(root)  # fresh caches, so the plots run does all the work again
        t0 = time.perf_counter()
        analyze(runs, bootstrap=a.bootstrap, out_dir=root / "out", plots=True)
        t_plots = time.perf_counter() - t0
    rows = a.trials * a.evals
    print(f"sweep: {a.trials} trials x {a.evals} evaluations = {rows:,} rows; bootstrap {a.bootstrap}; ")
    print(f"  {len(res['targets'])} targets, B_crit {[round(t['b_crit']) for t in res['targets']]} (truth 256)")
    print(f"write synthetic parquet   {t_write:7.2f} s (setup, not timed)")
    print(f"load + validate           {t_load:7.2f} s")
    print(f"analyze, no plots         {t_core:7.2f} s")
    print(f"analyze, with plots       {t_plots:7.2f} s")
    total = t_load + t_core
    print(f"load + analyze (no plots) {total:7.2f} s = {total / TARGET_S:.2f} x the {TARGET_S:.0f} s target")
    print(f"load + analyze (no plots) {cpu:7.2f} CPU s (this process; wall time above includes waiting)")
    print(f"load + analyze (plots)    {t_load + t_plots:7.2f} s = {(t_load + t_plots) / TARGET_S:.2f} x target")


if __name__ == "__main__":
    main()
