"""A quadratic sweep through the real machinery (Tune + tracking + tables): MLflow nesting, Parquet consistency,
and the end-to-end check of issue 5: the measured B_crit is within 25% of the closed form."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from analysis import metrics as M
from analysis.schema import validate_metrics, validate_trials
from orchestrator.spec import load_spec, parse_spec
from orchestrator.sweep import build_tuner, run
from tests.orchestrator.conftest import eval_steps_by_trial, mlflow_runs, quadratic_spec

pytestmark = pytest.mark.ray
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_mlflow_nesting_and_tables(tmp_path, ray_local, no_ray_address):
    spec = parse_spec(quadratic_spec(tmp_path))
    results = run(build_tuner(spec), spec)
    assert len(results) == 4 and all(r.error is None for r in results)

    client, parents, children = mlflow_runs(spec.sweep_dir)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.params["env.ray"] and "sweep_spec.yaml" in {
        a.path for a in client.list_artifacts(parents[0].info.run_id)
    }
    assert len(children) == 4
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert all(c.info.status == "FINISHED" for c in children)
    assert len({c.data.tags["trial_id"] for c in children}) == 4

    trials = validate_trials(pq.read_table(os.path.join(spec.sweep_dir, "trials.parquet")))
    metrics = validate_metrics(
        pq.read_table(os.path.join(spec.sweep_dir, "metrics.parquet")), trials.column("trial_id")
    )
    by_id = {r["trial_id"]: r for r in trials.to_pylist()}
    steps = eval_steps_by_trial(metrics)
    for c in children:
        tid = c.data.tags["trial_id"]
        row = by_id[tid]
        assert c.data.tags["status"] == row["status"] in M.FINAL_STATUSES
        for key in ("batch_size", "micro_batch_size", "grad_accum", "lr", "seed"):
            assert float(c.data.params[key]) == pytest.approx(float(row[key]))
        assert c.data.params["num_workers"] == "0" and row["num_workers"] == 1
        history = sorted((m.step, m.value) for m in client.get_metric_history(c.info.run_id, M.EVAL_LOSS))
        assert [s for s, _ in history] == steps[tid] == list(range(0, int(row["step"]) + 1))
        parquet = [
            v
            for t, n, v in zip(
                metrics.column("trial_id").to_pylist(),
                metrics.column("metric").to_pylist(),
                metrics.column("value").to_pylist(),
                strict=True,
            )
            if t == tid and n == M.EVAL_LOSS
        ]
        assert np.allclose([v for _, v in history], parquet)


# ~70 s (24 trials of up to 2000 steps): slow; the default suite runs the same spec through the same pipeline
# without Ray in seconds (test_quadratic_pipeline.py)
@pytest.mark.slow
def test_quadratic_sweep_recovers_closed_form_b_crit(tmp_path, ray_local, no_ray_address):
    from analysis.loaders import load_sweep_dir
    from analysis.quadratic import closed_form_b_crit
    from analysis.report import analyze

    spec = load_spec(os.path.join(ROOT, "examples", "quadratic.yaml"), [f"storage={tmp_path / 'q'}"])
    results = run(build_tuner(spec), spec)
    assert all(r.error is None for r in results)
    target = spec.stopping["target_loss"]
    out = analyze(load_sweep_dir(spec.sweep_dir), targets=[target], bootstrap=50)
    measured = out["targets"][0]["b_crit"]
    from trainables.quadratic import QuadraticConfig

    h, c, theta0 = QuadraticConfig.from_dict(
        {k: v for k, v in spec.fixed.items() if k in ("dim", "h_decay", "noise_scale", "theta0")}
    ).problem()
    truth = closed_form_b_crit(h, c, theta0**2, target, np.array(spec.batch_sizes), lrs=np.array(spec.nuisance["lr"]))
    assert measured == pytest.approx(truth.b_crit, rel=0.25)
