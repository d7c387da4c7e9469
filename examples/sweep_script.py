"""Your own Tune script on bcrit's sweep API: load and validate a spec, change it in code, add a callback of your
own, run, and read the results table.

    .venv/bin/python examples/sweep_script.py                 # the quadratic sweep, in seconds
    .venv/bin/python examples/sweep_script.py examples/tiny.yaml runs/my-script
    RAY_ADDRESS=HEAD:6379 .venv/bin/python examples/sweep_script.py  # on a cluster, as `bcrit sweep` would run

It launches the way `bcrit sweep` does (`prepare`: the cluster at RAY_ADDRESS joined, else a local Ray; every trial
checked first; a sweep already in the directory continued), and a mistake is one line, as on the command line.
"""

from __future__ import annotations

import sys

import pyarrow.parquet as pq
import ray
from ray.tune import Callback

from orchestrator.errors import UserError
from orchestrator.specs.sweep_spec import load_spec
from orchestrator.sweep import build_tuner, can_restore, prepare, restore_tuner, run


class PrintBest(Callback):
    """An extra Tune callback: the best objective (steps to target) seen so far."""

    best = float("inf")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get("status") != "running" and result["objective"] < self.best:
            self.best = result["objective"]
            print(f"new best: {trial.trial_id} objective {self.best:.1f}")


def main(path: str = "examples/quadratic.yaml", storage: str = "runs/sweep-script") -> None:
    spec = load_spec(path, [f"storage={storage}", "fixed.seeds=[0]"])  # same overrides as --set
    launch = prepare(spec, resume=can_restore(spec.sweep_dir, spec.storage_uri))  # the path `bcrit sweep` takes
    print(f"{len(launch.configs)} trials -> {spec.sweep_dir}; MLflow {spec.mlflow_uri}")
    print(f"Ray at {ray.get_runtime_context().gcs_address}")
    if launch.restore:
        tuner = restore_tuner(spec)  # an interrupted (or finished) sweep in that directory: continued
    else:
        tuner = build_tuner(spec, configs=launch.configs, extra_callbacks=[PrintBest()])
    results = run(tuner, spec)
    print(f"{len(results)} trials done")
    trials = pq.read_table(f"{spec.sweep_dir}/trials.parquet").to_pandas()
    print(trials[["trial_id", "batch_size", "lr", "status", "step"]].sort_values(["batch_size", "lr"]).to_string())


if __name__ == "__main__":
    try:
        main(*sys.argv[1:])
    except UserError as e:
        sys.exit(f"sweep_script: error: {e}")
