"""The adaptive searcher without Ray: trials simulated on the noisy quadratic model (the rule's own offline
simulator) and written to a sweep directory's tables, as Tune's TablesCallback would; then suggestions, pending
accounting, FINISHED on the budget and on the goal, and a save/restore round trip."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest
from ray.tune.search import Searcher

from analysis.decisions import next_trials as nt
from analysis.decisions.nqm_adaptive import concat, run_trial
from analysis.reporting.adaptive_report import DECISIONS_FILE, markdown_lines
from analysis.sources.loaders import runs_from_tables, write_sweep_dir
from orchestrator.adaptive_search import AdaptiveSearch
from orchestrator.adaptive_view import status_line

DIM = 200
H = np.arange(1, DIM + 1.0) ** -0.5
THETA0 = np.ones(DIM)
STOP = dict(max_steps=2000, target_loss=0.3, eval_every=1, divergence_factor=10.0)
SPACE = nt.Space((16, 64, 256, 1024), (0.5, 0.8, 1.2, 1.6, 1.95), max_seeds=2)
SEEDS = (7, 11)  # seed values of the spec: the rule counts seed indices 0, 1


def searcher(sweep_dir, goal=0.05, trials=None, examples=None) -> AdaptiveSearch:
    configs = {b: {"batch_size": b, "dim": DIM} for b in SPACE.batch_sizes}
    s = AdaptiveSearch(
        SPACE, nt.Goal((0.3,), goal), nt.Budget(examples, trials), configs, SEEDS, str(sweep_dir), bootstrap=50
    )
    s.set_max_concurrency(2)
    return s


class Lab:
    """Runs suggested trials on the NQM and keeps the sweep directory's tables, like TablesCallback."""

    def __init__(self, sweep_dir):
        self.dir, self.runs, self.n = str(sweep_dir), None, 0

    def finish(self, trial_id: str, config: dict) -> None:
        c = config["trial"]
        t = nt.Trial(c["batch_size"], c["lr"], SEEDS.index(c["seed"]))
        r = run_trial(H, H, THETA0, t, 0, **STOP)
        trials = r.trials.set_column(0, "trial_id", pa.array([trial_id]))
        i = trials.schema.get_field_index("seed")
        trials = trials.set_column(i, trials.schema.field(i), pa.array([c["seed"]], trials.schema.field(i).type))
        metrics = r.metrics.set_column(
            r.metrics.schema.get_field_index("trial_id"), "trial_id", pa.array([trial_id] * r.metrics.num_rows)
        )
        self.runs = concat(self.runs, runs_from_tables(trials, metrics))
        write_sweep_dir(self.runs, self.dir)


def drive(s: AdaptiveSearch, lab: Lab, concurrency: int = 2, limit: int = 200) -> list[tuple[str, dict]]:
    """Tune's loop in miniature: keep ``concurrency`` trials live, finish the oldest, until FINISHED."""
    live: list[tuple[str, dict]] = []
    issued: list[tuple[str, dict]] = []
    for _ in range(limit):
        while len(live) < concurrency:
            tid = f"t{len(issued):03d}"
            cfg = s.suggest(tid)
            if cfg == Searcher.FINISHED or cfg is None:
                break
            live.append((tid, cfg))
            issued.append((tid, cfg))
        if cfg == Searcher.FINISHED and not live:
            return issued
        if not live:
            raise AssertionError("the searcher waits with nothing pending")
        tid, cfg = live.pop(0)
        lab.finish(tid, cfg)
        s.on_trial_complete(tid, {})
    raise AssertionError("no stop")


def test_starts_with_the_design_and_keeps_concurrency(tmp_path):
    s = searcher(tmp_path)
    first = [s.suggest("a"), s.suggest("b")]
    design = nt.initial_design(SPACE)
    got = [nt.Trial(c["trial"]["batch_size"], c["trial"]["lr"], SEEDS.index(c["trial"]["seed"])) for c in first]
    assert got == design[:2]  # nothing finished: the design, in order, two at once (the concurrency)
    assert first[0]["trial"]["dim"] == DIM and first[0]["trial"]["seed"] == SEEDS[0]
    assert s.pending() == got  # handed out, not finished: pending
    third = s.suggest("c")  # the queue was two long: a refit with both pending picks the next design trial
    assert nt.Trial(third["trial"]["batch_size"], third["trial"]["lr"], 0) == design[2]


def test_a_trial_tune_ended_without_a_final_row_is_not_pending(tmp_path):
    s = searcher(tmp_path)
    a, b = s.suggest("a"), s.suggest("b")
    s.on_trial_complete("a", error=True)  # e.g. failed before it wrote a row: nothing to wait for
    assert s.pending() == [nt.Trial(b["trial"]["batch_size"], b["trial"]["lr"], 0)]
    assert a != b


def test_finished_on_trial_budget(tmp_path):
    s, lab = searcher(tmp_path, goal=0.01, trials=15), Lab(tmp_path)
    issued = drive(s, lab)
    assert len(issued) == 15  # never more than the budget, pending included
    assert s.suggest("late") == Searcher.FINISHED
    rec = json.loads((tmp_path / DECISIONS_FILE).read_text())
    assert rec["stop"] == nt.BUDGET_TRIALS
    assert [r["trial_id"] for r in rec["issued"]] == [t for t, _ in issued]
    assert all(r["kind"] and r["reason"] for r in rec["issued"])
    assert rec["refits"][-1]["trials_finished"] == 15
    # what the user sees of it: the progress line of each refit, the report's section
    assert status_line(rec, rec["refits"][-1]).endswith("stop: trial budget spent after 15 trials")
    first = status_line(rec, rec["refits"][0])
    assert first.startswith("B_crit at 0.3: no fit yet -> goal 1%; next: design at B=16 lr=")
    section = "\n".join(markdown_lines(rec))
    assert "stopped because the trial budget was spent, after 15 trials" in section
    assert all(f"`{t}`" in section for t, _ in issued)


def test_finished_on_examples_budget(tmp_path):
    s, lab = searcher(tmp_path, goal=0.01, examples=1.0e5), Lab(tmp_path)
    drive(s, lab)
    rec = json.loads((tmp_path / DECISIONS_FILE).read_text())
    assert rec["stop"] == nt.BUDGET_EXAMPLES
    assert rec["refits"][-1]["examples_spent"] >= 1.0e5


def test_finished_when_goal_met(tmp_path):
    s, lab = searcher(tmp_path, goal=0.6, trials=60), Lab(tmp_path)
    issued = drive(s, lab)
    rec = json.loads((tmp_path / DECISIONS_FILE).read_text())
    assert rec["stop"] == nt.GOAL_MET and len(issued) < 60
    w = rec["refits"][-1]["widths"]["0.3"]
    assert w is not None and w <= 0.6


def test_save_restore_gives_the_same_next_suggestions(tmp_path):
    a, lab = searcher(tmp_path, goal=0.01, trials=30), Lab(tmp_path)
    live = [(t, a.suggest(t)) for t in ("t0", "t1")]
    for _ in range(12):  # finish the oldest, hand out the next: mid-sweep with one trial pending
        tid, cfg = live.pop(0)
        lab.finish(tid, cfg)
        nxt = f"t{int(live[-1][0][1:]) + 1}"
        live.append((nxt, a.suggest(nxt)))
    path = str(tmp_path / "searcher-state.json")
    a.save(path)
    b = searcher(tmp_path, goal=0.01, trials=30)
    b.restore(path)
    assert b.pending() == a.pending() and len(b.pending()) == 2
    for k in range(3):
        assert b.suggest(f"n{k}") == a.suggest(f"n{k}")
    tid, cfg = live.pop(0)
    lab.finish(tid, cfg)
    assert b.suggest("m") == a.suggest("m")


def test_restore_with_a_tighter_goal_reopens_a_finished_search(tmp_path):
    a, lab = searcher(tmp_path, goal=0.6, trials=60), Lab(tmp_path)
    n = len(drive(a, lab))
    path = str(tmp_path / "state.json")
    a.save(path)
    b = searcher(tmp_path, goal=0.05, trials=60)
    b.restore(path)
    nxt = b.suggest("more")
    assert isinstance(nxt, dict)  # continues from the trials already run
    assert len(b.decisions()["issued"]) == n + 1


def test_restore_refuses_other_files(tmp_path):
    s = searcher(tmp_path)
    bad = tmp_path / "x.pkl"
    bad.write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(ValueError, match="not a bcrit adaptive searcher state"):
        s.restore(str(bad))
    other = AdaptiveSearch(
        nt.Space((16, 64, 128), (0.5,)), nt.Goal((0.3,)), nt.Budget(trials=3), {}, SEEDS, str(tmp_path)
    )
    other.save(str(tmp_path / "o.json"))
    with pytest.raises(ValueError, match="another sweep spec"):
        s.restore(str(tmp_path / "o.json"))
    assert not os.path.exists(tmp_path / "trials.parquet")
