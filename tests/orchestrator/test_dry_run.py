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
from orchestrator.execution.plan import busy_until, makespan, overhead
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


def _timed(own: list[float], inside: float, between: float, slots: int, pause_after: int | None = None) -> list[dict]:
    """Rows whose ``started_at`` / ``ended_at`` are the schedule of `makespan` (each trial on the first slot free,
    in order): a trial's span is its own seconds + ``inside``, its slot free ``between`` seconds after it; a 1,000 s
    pause (a resumed sweep) before trial ``pause_after``. Own seconds are split 1 : 4 into start-up and training."""
    free, rows, driver = [1.7e9] * slots, [], 1.7e9
    for i, s in enumerate(own):
        if i == pause_after:  # killed with no trial running, resumed by another driver 1,000 s later
            free = [max(free) + 1000.0] * slots
            driver = free[0]
        j = min(range(slots), key=free.__getitem__)
        start = free[j]
        free[j] = start + s + inside + between
        rows.append({"startup_seconds": 0.2 * s, "train_seconds": 0.8 * s, "started_at": start,
                     "ended_at": start + s + inside, "in_process": True, "driver_started_at": driver})  # fmt: skip
    return rows


def test_the_time_per_trial_outside_its_own_seconds_is_measured_from_the_spans():
    own = [5.0, 1.0, 7.0, 2.0, 2.0, 9.0, 3.0, 4.0]
    o = overhead(_timed(own, 3.0, 0.5, 2))
    assert (o.slots, o.trials) == (2, 8) and o.inside == {True: pytest.approx(3.0)}
    assert o.between == pytest.approx(0.5, abs=1e-9) and o.wall == pytest.approx(
        makespan([s + 3.5 for s in own], 2) - 0.5
    )
    paused = overhead(_timed(own, 3.0, 0.5, 2, pause_after=4))  # the pause is not the slots' time
    held = [s + 3.0 for s in own]
    assert paused.between == pytest.approx(0.5, abs=1e-9)
    assert paused.wall == pytest.approx(busy_until(held[:4], 0.5, 2) + busy_until(held[4:], 0.5, 2))
    assert overhead(_timed(own, 0.0, 0.0, 3)).between == pytest.approx(0.0, abs=1e-9)
    group = _timed(own, 3.0, 0.5, 2)
    group[2] = {**group[2], "in_process": False, "ended_at": group[2]["ended_at"]}
    two = overhead([{**r, "ended_at": r["ended_at"] + 10.0} if not r["in_process"] else r for r in group])
    assert two.inside == {True: pytest.approx(3.0), False: pytest.approx(13.0)}  # a worker group's start, by kind
    handed_on = [{"started_at": 0.0, "ended_at": 4.0, "train_seconds": 4.0}, {"started_at": 4.0, "ended_at": 6.0}]
    assert overhead(handed_on).slots == 1  # a slot handed on at one instant is one slot
    assert overhead([{"train_seconds": 4.0, "started_at": 5.0, "ended_at": None}]) is None  # nothing to measure


def test_the_wall_is_priced_with_the_past_sweeps_time_per_trial(tmp_path, capsys, monkeypatch):
    """A past sweep whose trials each held their slot 3 s past their own seconds, and 1 s more before the next
    trial started on it: the plan's wall is its trials' own seconds + 4 s each, scheduled on its slots; the trial
    hours stay the trials' own."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = load_spec(TINY)
    configs = spec.trial_configs()
    past = tmp_path / "past"
    past.mkdir()
    (past / SPEC_FILE).write_text(spec.to_yaml())
    own = [2.0 + 0.1 * c["max_steps"] for c in configs]
    spans = _timed(own, 3.0, 1.0, 2)
    rows = [
        {**trial_row(f"t{i}", c, "budget_spent", {"step": c["max_steps"], "examples": c["max_steps"] * c["batch_size"],
                                                  "train_seconds": 0.1 * c["max_steps"], "startup_seconds": 2.0}),
         "started_at": t["started_at"], "ended_at": t["ended_at"]}
        for i, (c, t) in enumerate(zip(configs, spans, strict=True))
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), past / "trials.parquet")
    assert main(["sweep", TINY, "--dry-run", "--throughput-from", str(past), "--set", f"storage={tmp_path}/new"]) == 0
    out = capsys.readouterr().out
    wall = busy_until([s + 3.0 for s in own], 1.0, 2)
    assert f"({wall:.0f} s, 2 trials at once)" in out and f"{sum(own) / 3600:.2f} trial hours" in out
    assert f"~8,080 steps, ~273,280 examples, ~{wall / 3600:.2f} wall hours ({wall:.0f} s)" in out  # the estimate too
    assert f"measured in {past}: 3.0 s in process / 3.0 s a worker group inside a trial, 1.0 s between trials" in out


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


def test_the_sweep_records_when_the_driver_started_and_ended_each_trial(tmp_path, monkeypatch):
    """TablesCallback writes each trial's span on the driver's clock: ``started_at`` from its start, ``ended_at``
    once it ends (a result with a final status, or an error); a running trial has no end yet."""
    from types import SimpleNamespace

    from orchestrator.records import tables_callback

    now = iter([99.0, 100.0, 101.0, 110.0, 120.0, 130.0])
    monkeypatch.setattr(tables_callback, "time", SimpleNamespace(time=lambda: next(now)))
    cb = tables_callback.TablesCallback(str(tmp_path))
    cfg = {"batch_size": 8, "micro_batch_size": 8, "grad_accum": 1, "num_workers": 0, "lr": 1e-3, "seed": 0}
    t1, t2, t3 = (SimpleNamespace(trial_id=f"t{i}", config={"trial": cfg}, last_result={}) for i in (1, 2, 3))
    cb.on_trial_start(0, [], t1)
    cb.on_trial_start(0, [], t2)
    cb.on_trial_result(0, [], t1, {"status": "reached_target", "step": 5, "train_seconds": 4.0})
    cb.on_trial_error(0, [], t2)
    cb.on_trial_start(0, [], t3)
    cb.on_experiment_end([])
    rows = pq.read_table(tmp_path / "trials.parquet").to_pylist()
    assert {r["driver_started_at"] for r in rows} == {99.0}
    assert {r["trial_id"]: (r["started_at"], r["ended_at"]) for r in rows} == {
        "t1": (100.0, 110.0), "t2": (101.0, 120.0), "t3": (130.0, None)}  # fmt: skip
