"""Your own Tune script on bcrit's sweep API: load and validate a spec, change it in code, add a callback of your
own, run, and read the results table.

    .venv/bin/python examples/sweep_script.py                 # the quadratic sweep, in seconds
    .venv/bin/python examples/sweep_script.py examples/tiny.yaml
"""

from __future__ import annotations

import sys

import pyarrow.parquet as pq
from ray.tune import Callback

from orchestrator.spec import load_spec
from orchestrator.sweep import build_tuner, check_spec, run, start_ray


class PrintBest(Callback):
    """An extra Tune callback: the best objective (steps to target) seen so far."""

    best = float("inf")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get("status") != "running" and result["objective"] < self.best:
            self.best = result["objective"]
            print(f"new best: {trial.trial_id} objective {self.best:.1f}")


def main(path: str = "examples/quadratic.yaml") -> None:
    spec = load_spec(path, ["storage=runs/sweep-script", "fixed.seeds=[0]"])  # same overrides as --set
    start_ray(spec)  # RAY_ADDRESS if set, else a local Ray
    configs = check_spec(spec)  # every trial validated before launch
    print(f"{len(configs)} trials -> {spec.sweep_dir}; MLflow {spec.mlflow_uri}")
    results = run(build_tuner(spec, configs=configs, extra_callbacks=[PrintBest()]), spec)
    print(f"{len(results)} trials done")
    trials = pq.read_table(f"{spec.sweep_dir}/trials.parquet").to_pandas()
    print(trials[["trial_id", "batch_size", "lr", "status", "step"]].sort_values(["batch_size", "lr"]).to_string())


if __name__ == "__main__":
    main(*sys.argv[1:])
