"""An adaptive sweep of the quadratic workload through the CLI (Ray Tune, MLflow, tables): the trial budget is
respected, the stop reason recorded, the parent run carries the interval's width per refit, and `bcrit analyze`
runs on the result and reports the design."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from analysis.core import metrics as M
from orchestrator.cli.main import main
from orchestrator.storage.layout import DECISIONS_FILE
from tests.orchestrator.conftest import kill_sweep_midway, mlflow_runs, quadratic_spec, write_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]
BUDGET = 12


def adaptive_quadratic(tmp_path, trials: int = BUDGET, rel_ci: float = 0.02) -> dict:
    spec = quadratic_spec(tmp_path)
    spec["scientific"]["batch_sizes"] = [16, 64, 256]
    spec["nuisance"] = {"search": "adaptive", "lr": [0.5, 1.0, 1.5, 1.9], "goal": {"rel_ci": rel_ci},
                        "budget": {"trials": trials}}  # fmt: skip
    spec["fixed"].update(dim=200, h_decay=0.5, seeds=[0, 1], report_every=50, checkpoint_every=100)
    spec["stopping"] = {"target_loss": 0.5, "max_steps": 400, "divergence_factor": 10.0}
    return spec


def test_adaptive_sweep_respects_the_budget_analyze_reports_it_and_resume_extends_it(
    tmp_path, ray_local, no_ray_address, capsys
):
    path = write_spec(tmp_path, adaptive_quadratic(tmp_path))
    sweep_dir = str(tmp_path / "sweep")
    assert main(["sweep", path]) == 0
    out = capsys.readouterr().out
    assert "-> goal 2%" in out and "stop: trial budget spent" in out

    trials = pq.read_table(os.path.join(sweep_dir, "trials.parquet")).to_pylist()
    assert len(trials) == BUDGET and all(t["status"] in M.FINAL_STATUSES for t in trials)
    d = json.loads(open(os.path.join(sweep_dir, DECISIONS_FILE)).read())
    assert d["stop"] == "budget_trials" and len(d["issued"]) == BUDGET
    assert {t["trial_id"] for t in trials} == {t["trial_id"] for t in d["issued"]}
    assert sorted((t["batch_size"], t["lr"], t["seed"]) for t in trials) == sorted(
        (t["batch_size"], t["lr"], t["seed"]) for t in d["issued"]
    )  # each trial ran the config the design chose

    client, parents, _ = mlflow_runs(sweep_dir)
    history = client.get_metric_history(parents[0].info.run_id, M.ADAPTIVE_REL_CI)
    fitted = [r for r in d["refits"] if all(w is not None for w in r["widths"].values())]
    assert fitted and len(history) == len(fitted)
    assert parents[0].data.tags["bcrit.adaptive_stop"] == "budget_trials"

    out_dir = tmp_path / "analysis"
    assert main(["analyze", sweep_dir, "--targets", "0.5", "--bootstrap", "100", "--out", str(out_dir)]) == 0
    report = (out_dir / "report.md").read_text()
    assert "## Adaptive design" in report and "trial budget was spent" in report
    assert all(t["trial_id"] in report for t in d["issued"])

    # a larger budget on --resume continues from the trials already run (the first ones unchanged)
    assert main(["sweep", sweep_dir, "--resume", "--set", f"nuisance.budget.trials={BUDGET + 3}"]) == 0
    again = pq.read_table(os.path.join(sweep_dir, "trials.parquet")).to_pylist()
    assert len(again) == BUDGET + 3 and {t["trial_id"] for t in trials} < {t["trial_id"] for t in again}
    d2 = json.loads(open(os.path.join(sweep_dir, DECISIONS_FILE)).read())
    assert d2["stop"] == "budget_trials" and d2["issued"][:BUDGET] == d["issued"]
    assert f"{BUDGET + 3}/{BUDGET + 3} trials finished" in capsys.readouterr().out
    # any other change on --resume is refused as before
    assert main(["sweep", sweep_dir, "--resume", "--set", "stopping.max_steps=10"]) == 2


def test_driver_killed_mid_sweep_then_resumed(tmp_path, ray_local, no_ray_address):
    path = write_spec(tmp_path, adaptive_quadratic(tmp_path))
    sweep_dir = str(tmp_path / "sweep")
    kill_sweep_midway(tmp_path, path, parts_needed=3)
    assert main(["sweep", sweep_dir, "--resume"]) == 0
    trials = pq.read_table(os.path.join(sweep_dir, "trials.parquet")).to_pylist()
    d = json.loads(open(os.path.join(sweep_dir, DECISIONS_FILE)).read())
    assert d["stop"] == "budget_trials"
    # a trial started just before the kill and lost by Tune has its rows removed by --resume
    # (orchestrator.records.lost_trials): the searcher neither counts it nor waits for it, and its setting may run again
    final = [t for t in trials if t["status"] in M.FINAL_STATUSES]
    assert len(final) == BUDGET  # none lost, none extra
    assert {t["trial_id"] for t in final} <= {t["trial_id"] for t in d["issued"]}
    settings = [(t["batch_size"], t["lr"], t["seed"]) for t in final]
    assert len(set(settings)) == BUDGET  # no finished setting run twice across the kill


def test_a_goal_met_with_trials_running_ends_them(tmp_path, ray_local, no_ray_address, capsys, monkeypatch):
    """``goal.running: end`` on examples/quadratic-adaptive.yaml with a wide goal, trials slowed to seconds and 4 at
    once (what a cluster
    holds; the local Ray runs as many as its cores): when the goal is met on the finished trials the sweep stops at
    once and the running trials end themselves at their next evaluation (trainables.sweep_signal): status
    ``ended_at_goal`` in the tables and the MLflow child run (FINISHED), the progress and `bcrit analyze` say so,
    and the analysis leaves them out."""
    import orchestrator.cluster.sizing

    monkeypatch.setattr(orchestrator.cluster.sizing, "compute_slots", lambda configs: 4)  # the Tuner's concurrency
    sweep_dir = str(tmp_path / "sweep")
    sets = [
        f"storage={sweep_dir}",
        "nuisance.goal.rel_ci=0.95",
        "nuisance.goal.running=end",
        "nuisance.goal.hold=false",  # with holding, the trials the goal would end are seldom started
        "fixed.step_seconds=0.004",
    ]
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "quadratic-adaptive.yaml")
    assert main(["sweep", example, *[x for s in sets for x in ("--set", s)]]) == 0
    out = capsys.readouterr().out
    d = json.loads(open(os.path.join(sweep_dir, DECISIONS_FILE)).read())
    assert d["stop"] == "goal_met"
    asked = d["refits"][-1]["ending"]
    assert asked and "running trial(s) (kept, not fitted)" in out  # 4 at once: others were running
    trials = {t["trial_id"]: t for t in pq.read_table(os.path.join(sweep_dir, "trials.parquet")).to_pylist()}
    ended = [t for t in asked if trials[t]["status"] == M.STATUS_ENDED]  # (one may have finished first)
    assert ended and all(trials[t]["status"] in M.FINAL_STATUSES for t in asked)
    assert all(trials[t]["step"] < 2000 for t in ended) and "the sweep's goal was met (kept, not fitted)" in out
    client, _, children = mlflow_runs(sweep_dir)
    by_trial = {r.data.tags["trial_id"]: r for r in children}
    assert all(by_trial[t].info.status == "FINISHED" and by_trial[t].data.tags["status"] == M.STATUS_ENDED
               for t in ended)  # fmt: skip
    out_dir = tmp_path / "analysis"
    assert main(["analyze", sweep_dir, "--targets", "0.5", "--bootstrap", "100", "--out", str(out_dir)]) == 0
    report = (out_dir / "report.md").read_text()
    assert f"{len(ended)} ended_at_goal" in report and all(f"`{t}`" in report for t in asked)
