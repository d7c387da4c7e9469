"""``bcrit branch`` through Ray Tune: the reference and every branch as Tune trials, one MLflow child run each under
the study's parent, branch columns in trials.parquet, rows identical to the in-process run of the same spec, and
``--resume`` of a finished study trains nothing more."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from analysis.core import metrics as M
from orchestrator.cli.main import main
from orchestrator.features.branched.branch_study import parse_branch_spec
from tests.orchestrator.branch_inprocess import run_inprocess
from tests.orchestrator.conftest import mlflow_runs
from tests.orchestrator.test_branch_quadratic import quadratic_branch_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # ~45 s; the in-process test_branch_quadratic is the fast equivalent


def _eval_rows(sweep_dir: str) -> dict[tuple, list[float]]:
    """(branch_step, k, seed) -> eval/loss values in step order ('ref' for the reference)."""
    t = pq.read_table(os.path.join(sweep_dir, "trials.parquet")).to_pylist()
    key = {r["trial_id"]: ("ref",) if not r["parent_trial_id"] else (r["branch_step"], r["k"], r["seed"]) for r in t}
    m = pq.read_table(os.path.join(sweep_dir, "metrics.parquet")).to_pylist()
    out: dict[tuple, list[float]] = {}
    for r in m:
        if r["metric"] == M.EVAL_LOSS:
            out.setdefault(key[r["trial_id"]], []).append(r["value"])
    return out


def test_branch_study_through_ray(tmp_path, ray_local, no_ray_address, capsys):
    raw = quadratic_branch_spec(tmp_path, points=[100, 200], multipliers=[2, 4], seeds=[0])
    path = tmp_path / "branch.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["branch", str(path)]) == 0
    spec = parse_branch_spec(raw)
    trials = pq.read_table(os.path.join(spec.sweep_dir, "trials.parquet")).to_pylist()
    assert len(trials) == 1 + 2 * 3
    ref = [r for r in trials if not r["parent_trial_id"]]
    assert len(ref) == 1 and ref[0]["status"] == M.STATUS_BUDGET_SPENT
    branches = [r for r in trials if r["parent_trial_id"]]
    assert {r["parent_trial_id"] for r in branches} == {ref[0]["trial_id"]}
    assert sorted((r["branch_step"], r["k"]) for r in branches) == [(p, k) for p in (100, 200) for k in (1.0, 2.0, 4.0)]
    assert all(r["batch_size"] == r["k"] * 8 and r["status"] == M.STATUS_BUDGET_SPENT for r in branches)

    client, parents, children = mlflow_runs(spec.sweep_dir)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == len(trials) and all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert {c.data.params.get("extra.parent_trial_id") for c in children} == {None, ref[0]["trial_id"]}

    # the same study in-process gives the same rows (the Tune path adds no randomness of its own)
    local = parse_branch_spec(raw, sweep_dir=str(tmp_path / "local"))
    run_inprocess(local)
    ray_rows, local_rows = _eval_rows(spec.sweep_dir), _eval_rows(local.sweep_dir)
    assert ray_rows.keys() == local_rows.keys()
    for key, values in ray_rows.items():
        assert np.allclose(values, local_rows[key], rtol=1e-12), key

    # resuming a finished study: nothing new to train, the tables unchanged
    capsys.readouterr()
    before = pq.read_table(os.path.join(spec.sweep_dir, "metrics.parquet")).num_rows
    assert main(["branch", spec.sweep_dir, "--resume"]) == 0
    assert pq.read_table(os.path.join(spec.sweep_dir, "metrics.parquet")).num_rows == before
    assert main(["branch", str(path)]) == 2  # the study dir is taken: --resume or a new storage
    assert "--resume" in capsys.readouterr().err

    # bcrit analyze: the answer and its artifacts on the study's MLflow parent run
    assert main(["analyze", spec.sweep_dir, "--out", str(tmp_path / "a"), "--bootstrap", "0"]) == 0
    arts = {a.path for a in client.list_artifacts(parents[0].info.run_id, "analysis")}
    assert {"analysis/bcrit.json", "analysis/report.md", "analysis/branched.png"} <= arts


def _dit_branch_spec(tmp_path, name: str, scale_by: str) -> dict:
    return {
        "kind": "branched",
        "name": name,
        "workload": "dit",
        "reference": {"batch_size": 8, "lr": 5e-3, "seed": 0, "split": {"grad_accum": 1, "num_workers": 0}},
        "branches": {
            "points": [10],
            "multipliers": [2],
            "lr_rule": "sqrt",
            "examples": 128,
            "evals": 2,
            "seeds": [0],
            "scale_by": scale_by,
        },
        "analysis": {"epsilons": [0.02]},
        "fixed": {"preset": "tiny", "dataset": "digits", "eval_every": 5, "eval_repeats": 1, "timestep_bins": 2},
        "stopping": {"divergence_factor": 3.0},
        "tracking": {"experiment": name},
        "storage": str(tmp_path / name),
    }


def test_branches_on_more_workers_equal_branches_on_larger_micro_batches(tmp_path, ray_local, no_ray_address):
    """scale_by: num_workers (k = 2: two DDP workers of 8, gloo, restored from an in-process reference's kept
    checkpoint) trains the same branch as scale_by: micro_batch_size (one worker of 16): the same losses."""
    dirs = {}
    for scale_by in ("num_workers", "micro_batch_size"):
        raw = _dit_branch_spec(tmp_path, f"mw-{scale_by.replace('_', '-')}", scale_by)
        path = tmp_path / f"{scale_by}.yaml"
        path.write_text(yaml.safe_dump(raw))
        assert main(["branch", str(path)]) == 0
        dirs[scale_by] = raw["storage"]
    trials = pq.read_table(os.path.join(dirs["num_workers"], "trials.parquet")).to_pylist()
    k2 = [r for r in trials if r["k"] == 2.0]
    assert len(k2) == 1 and (k2[0]["micro_batch_size"], k2[0]["num_workers"], k2[0]["batch_size"]) == (8, 2, 16)
    a, b = _eval_rows(dirs["num_workers"]), _eval_rows(dirs["micro_batch_size"])
    assert a.keys() == b.keys() and (10, 2.0, 0) in a
    for key in a:
        assert np.allclose(a[key], b[key], rtol=1e-5), (key, a[key], b[key])
