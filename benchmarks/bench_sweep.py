"""Sweep efficiency (issue 4): total trial training time / sweep wall time, and mean trial start-up seconds.

    .venv/bin/python benchmarks/bench_sweep.py examples/tiny.yaml          # runs the sweep in a fresh dir
    .venv/bin/python benchmarks/bench_sweep.py --dir runs/tiny --wall 353  # numbers of a sweep already run

Training time is each trial's ``train_seconds`` (optimizer steps only; trials.parquet); start-up is the trial's
own ``startup_seconds`` (model, data, restore) plus, measured here, the time from the sweep start to the trial's
first result (actor start, imports, Train worker group). Ratios, not timed asserts.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import pyarrow.parquet as pq


def summarize(sweep_dir: str, wall: float) -> dict:
    t = pq.read_table(os.path.join(sweep_dir, "trials.parquet")).to_pylist()
    train = sum(r["train_seconds"] or 0.0 for r in t)
    startup = [r["startup_seconds"] or 0.0 for r in t]
    return {
        "trials": len(t),
        "wall_s": wall,
        "train_s_total": train,
        "efficiency": train / wall,
        "mean_startup_s": sum(startup) / len(startup),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("spec", nargs="?", default="examples/tiny.yaml")
    p.add_argument("--dir", help="summarise an existing sweep dir instead of running one")
    p.add_argument("--wall", type=float, help="with --dir: the sweep's wall seconds")
    args = p.parse_args()
    if args.dir:
        s = summarize(args.dir, args.wall)
    else:
        from orchestrator.specs.sweep_spec import load_spec
        from orchestrator.sweep import build_tuner, prepare, run

        out = tempfile.mkdtemp(prefix="bcrit-bench-")
        spec = load_spec(args.spec, [f"storage={out}"])
        configs = prepare(spec).configs  # as `bcrit sweep`: trials checked, then Ray
        t0 = time.perf_counter()
        results = run(build_tuner(spec, configs=configs), spec)
        wall = time.perf_counter() - t0
        s = summarize(spec.sweep_dir, wall)
        first = [r.metrics_dataframe["time_total_s"].iloc[0] for r in results if r.metrics_dataframe is not None]
        s["mean_time_to_first_result_s"] = sum(first) / max(1, len(first))
    for k, v in s.items():
        print(f"{k:>28s}  {v:.3f}" if isinstance(v, float) else f"{k:>28s}  {v}")


if __name__ == "__main__":
    main()
