"""``bcrit sweep SPEC --dry-run`` and ``bcrit branch SPEC --dry-run``: the plan printed, exit 0, nothing started and
nothing written (no sweep directory, no mlflow.db); a throughput from a past sweep of the same preset and device, and
one line refusing any other."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.execution.plan import makespan
from orchestrator.records.runs_tables import trial_row
from orchestrator.specs.sweep_spec import load_spec
from orchestrator.storage.layout import SPEC_FILE

TINY = "examples/tiny.yaml"


def test_a_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    import ray

    where = tmp_path / "never"
    assert main(["sweep", TINY, "--dry-run", "--set", f"storage={where}"]) == 0
    out = capsys.readouterr().out
    assert not where.exists() and not list(tmp_path.iterdir())  # no sweep directory, no mlflow.db
    assert not ray.is_initialized()
    assert "62 trials" in out and "at most 8,080 optimizer steps, 273,280 examples" in out
    assert "   64    32x2x0       1         80  lr 0.01; seeds 0" in out  # the accumulation variant, its own line
    assert "an upper bound" in out and "time: unknown" in out


def test_the_throughput_of_a_past_sweep_prices_the_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = load_spec(TINY)
    past = tmp_path / "past"
    past.mkdir()
    (past / SPEC_FILE).write_text(spec.to_yaml())
    rows = [  # every trial its budget at 0.1 s a step, 2 s of start-up
        trial_row(f"t{i}", c, "budget_spent", {"step": c["max_steps"], "examples": c["max_steps"] * c["batch_size"],
                                               "train_seconds": 0.1 * c["max_steps"], "startup_seconds": 2.0})
        for i, c in enumerate(spec.trial_configs())
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), past / "trials.parquet")
    assert main(["sweep", TINY, "--dry-run", "--throughput-from", str(past), "--set", f"storage={tmp_path}/new"]) == 0
    out = capsys.readouterr().out
    trial_s = [2.0 + 0.1 * c["max_steps"] for c in spec.trial_configs()]
    wall = makespan(trial_s, 2)
    assert f"({wall:.0f} s, 2 trials at once)" in out and f"{sum(trial_s) / 3600:.2f} trial hours" in out
    assert f"if trials stop as early as in {past}: ~8,080 steps, ~273,280 examples, ~{wall / 3600:.2f}" in out
    assert not (tmp_path / "new").exists()

    saved = yaml.safe_load((past / SPEC_FILE).read_text())
    saved["fixed"]["preset"] = "small"
    (past / SPEC_FILE).write_text(yaml.safe_dump(saved))
    assert main(["sweep", TINY, "--dry-run", "--throughput-from", str(past)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fixed.preset is 'small', this spec's 'tiny'" in err[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sweep", TINY, "--throughput-from", "runs/tiny"], "--throughput-from goes with --dry-run"),
        (["sweep", "runs/tiny", "--resume", "--dry-run"], "drop --resume"),
    ],
)
def test_dry_run_options_misused_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_branched_study_dry_run_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    where = tmp_path / "study"
    assert main(["branch", "examples/branched-tiny.yaml", "--dry-run", "--set", f"storage={where}"]) == 0
    out = capsys.readouterr().out
    assert not where.exists() and os.listdir(tmp_path) == []
    assert "dry run of branched study" in out and "31 trials" in out


def test_with_ray_address_the_plan_is_sized_by_what_the_cluster_can_hold(tmp_path, capsys, monkeypatch):
    """The cluster's capacity (orchestrator.cluster.capacity, read after joining) sizes the checks and the
    concurrency; the join itself is stubbed here (tests/orchestrator/test_capacity*.py read a real one)."""
    from orchestrator.cluster.capacity import Capacity
    from orchestrator.execution import plan

    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    cap = Capacity({"CPU": 64.0, "GPU": 0.0}, [{"CPU": 16.0}], "the autoscaler's node types (YAML)")
    monkeypatch.setattr(plan, "cluster_capacity", lambda: cap)
    spec = load_spec(TINY, [f"storage={tmp_path}/s"])
    p = plan.sweep_plan(spec)
    assert p.concurrency == 64 // 3 and p.where == cap.describe()  # the 2-worker trial: 1 driver + 2 workers
    cap.total["CPU"] = 2.0
    with pytest.raises(Exception, match="needs 3 CPUs"):
        plan.sweep_plan(spec)
    assert not (tmp_path / "s").exists()
