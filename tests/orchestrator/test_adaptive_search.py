"""The adaptive searcher without Ray: trials simulated on the noisy quadratic model (the rule's own offline
simulator) and written to a sweep directory's tables, as Tune's TablesCallback would; then suggestions, pending
accounting, FINISHED on the budget and on the goal, and a save/restore round trip."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from ray.tune.search import Searcher

from analysis.core import metrics as M
from analysis.features.adaptive import next_trials as nt
from analysis.features.adaptive.adaptive_report import markdown_lines
from analysis.sources.loaders import runs_from_tables
from orchestrator.features.adaptive.adaptive_search import AdaptiveSearch
from orchestrator.features.adaptive.adaptive_view import status_line
from orchestrator.storage.layout import DECISIONS_FILE
from tests.oracles.nqm_adaptive import concat, run_trial
from tests.oracles.sweep_dir import write_sweep_dir

DIM = 200
H = np.arange(1, DIM + 1.0) ** -0.5
THETA0 = np.ones(DIM)
STOP = dict(max_steps=2000, target_loss=0.3, eval_every=1, divergence_factor=10.0)
SPACE = nt.Space((16, 64, 256, 1024), (0.5, 0.8, 1.2, 1.6, 1.95), max_seeds=2)
SEEDS = (7, 11)  # seed values of the spec: the rule counts seed indices 0, 1


def searcher(sweep_dir, goal=0.05, trials=None, examples=None, end_running=False, hold=True) -> AdaptiveSearch:
    configs = {b: {"batch_size": b, "dim": DIM} for b in SPACE.batch_sizes}
    s = AdaptiveSearch(
        SPACE, nt.Goal((0.3,), goal), nt.Budget(examples, trials), configs, SEEDS, str(sweep_dir), bootstrap=50,
        end_running=end_running, hold=hold,
    )  # fmt: skip
    s.set_max_concurrency(2)
    return s


class Lab:
    """Runs suggested trials on the NQM and keeps the sweep directory's tables, like TablesCallback."""

    def __init__(self, sweep_dir):
        self.dir, self.runs, self.n = str(sweep_dir), None, 0

    def finish(self, trial_id: str, config: dict, ended_at: int | None = None) -> None:
        """The trial's rows and final status; ``ended_at``: ended by the sweep there (status ``ended_at_goal``)."""
        c = config["trial"]
        t = nt.Trial(c["batch_size"], c["lr"], SEEDS.index(c["seed"]))
        r = run_trial(H, H, THETA0, t, 0, **STOP)
        trials = r.trials.set_column(0, "trial_id", pa.array([trial_id]))
        i = trials.schema.get_field_index("seed")
        trials = trials.set_column(i, trials.schema.field(i), pa.array([c["seed"]], trials.schema.field(i).type))
        metrics = r.metrics.set_column(
            r.metrics.schema.get_field_index("trial_id"), "trial_id", pa.array([trial_id] * r.metrics.num_rows)
        )
        if ended_at is not None:
            metrics = metrics.filter(pc.less_equal(metrics.column("step"), ended_at))
            trials = trials.set_column(trials.schema.get_field_index("status"), "status", pa.array([M.STATUS_ENDED]))
        self.runs = concat(self.runs, runs_from_tables(trials, metrics))
        write_sweep_dir(self.runs, self.dir)


def drive(
    s: AdaptiveSearch, lab: Lab, concurrency: int = 2, limit: int = 200, live=(), first: int = 0
) -> list[tuple[str, dict]]:
    """Tune's loop in miniature: keep ``concurrency`` trials live, finish the oldest, until FINISHED. A resumed
    sweep starts with the trials Tune restores running (``live``), new trial ids numbered from ``first``."""
    live: list[tuple[str, dict]] = list(live)
    issued: list[tuple[str, dict]] = []
    for _ in range(limit):
        while len(live) < concurrency:
            tid = f"t{first + len(issued):03d}"
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
    last = rec["refits"][-1]
    assert set(last["flags"]) == {"0.3"}  # the analysis's flags at each goal target
    assert status_line(rec, {**last, "flags": {"0.3": []}}).endswith("stop: trial budget spent after 15 trials")
    flagged = status_line(rec, {**last, "flags": {"0.3": ["near_floor"]}})
    assert flagged.endswith("after 15 trials; FLAGGED: near_floor at 0.3 (bcrit analyze says why)")
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
    s, lab = searcher(tmp_path, goal=0.8, trials=60), Lab(tmp_path)
    issued = drive(s, lab)
    rec = json.loads((tmp_path / DECISIONS_FILE).read_text())
    assert rec["stop"] == nt.GOAL_MET and len(issued) < 60
    w = rec["refits"][-1]["widths"]["0.3"]  # the confirming refit's width, as bcrit analyze would report it
    assert w is not None and w <= 0.8 and rec["refits"][-1]["confirmed"] == nt.CONFIRM_BOOTSTRAP


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
    a, lab = searcher(tmp_path, goal=0.8, trials=60), Lab(tmp_path)
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


def tune_saves(experiment_dir, trials: dict[str, dict]) -> None:
    """Tune's trial list (``experiment_state-*.json``) as ``Tuner.restore`` reads it: the trials and their configs."""
    data = [[json.dumps({"trial_id": t, "config": c}), "{}"] for t, c in trials.items()]
    (experiment_dir / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": data}))


def killed_after(tmp_path, lab: Lab, *, lost_ends: bool, state_after_lost: bool):
    """A sweep (trial budget 8, 2 at once) killed after Tune's last save of its trial list (trials t0..t5, t5
    still running) and after one more trial, t6, was handed out: it ended before the kill (its final row in the
    tables) when ``lost_ends``, else it was running. The searcher state is saved after t6 was handed out when
    ``state_after_lost`` (the two files are uploaded one after the other), else just before. Returns the restored
    searcher, t6's config, and the trial Tune restores running."""
    exp = tmp_path / "tune"
    exp.mkdir()
    a = searcher(tmp_path, goal=0.01, trials=8)
    issued = {t: a.suggest(t) for t in ("t0", "t1")}
    for k in range(4):  # finish the oldest, hand out the next
        lab.finish(f"t{k}", issued[f"t{k}"])
        issued[f"t{k + 2}"] = a.suggest(f"t{k + 2}")
    lab.finish("t4", issued["t4"])
    tune_saves(exp, issued)  # Tune's last save: t0..t5 (t4 finished since, t5 running)
    if not state_after_lost:
        a.save(str(exp / "searcher-state-2026-01-01_00-00-00.pkl"))
    lost = a.suggest("t6")
    if lost_ends:
        lab.finish("t6", lost)
        a.on_trial_complete("t6", {})
    if state_after_lost:
        a.save(str(exp / "searcher-state-2026-01-01_00-00-00.pkl"))
    b = searcher(tmp_path, goal=0.01, trials=8)  # the resumed driver: Tuner.restore restores the searcher
    b.restore_from_dir(str(exp))
    return b, lost, ("t5", issued["t5"])


def setting(cfg: dict) -> nt.Trial:
    c = cfg["trial"]
    return nt.Trial(c["batch_size"], c["lr"], SEEDS.index(c["seed"]))


@pytest.mark.parametrize("state_after_lost", [True, False], ids=["state-newer", "state-older"])
def test_a_trial_tune_lost_while_running_is_handed_out_again(tmp_path, state_after_lost):
    """A trial handed out after Tune's last save of its trial list and running at the kill is lost (Tune never
    runs it again; its records are removed, orchestrator.records.lost_trials). The resumed searcher must not wait for it
    (pending for ever: the trial budget never spent, the sweep stalled with nothing running): its setting is
    handed out again, and the sweep spends exactly its budget."""
    lab = Lab(tmp_path)
    b, lost, running = killed_after(tmp_path, lab, lost_ends=False, state_after_lost=state_after_lost)
    assert setting(lost) not in b.pending()
    assert sorted(b.pending()) == [setting(running[1])]  # only the trial Tune restores running
    rest = drive(b, lab, live=[running], first=8)
    assert rest[0][1] == lost  # the lost trial's setting, handed out again first
    assert len(lab.runs.trial_ids) == 8 and b.decisions()["stop"] == nt.BUDGET_TRIALS
    assert [t["trial_id"] for t in b.decisions()["lost"]] == (["t6"] if state_after_lost else [])  # the record
    assert "t6" not in {r["trial_id"] for r in b.decisions()["issued"]}
    assert ("Lost with a killed driver" in "\n".join(markdown_lines(b.decisions()))) == state_after_lost


@pytest.mark.parametrize("state_after_lost", [True, False], ids=["state-newer", "state-older"])
def test_a_trial_that_ended_after_tunes_last_save_counts_as_finished(tmp_path, state_after_lost):
    """A trial handed out and ended between Tune's last save and the kill: Tune never runs it again, the tables
    hold its result. It counts as finished -- not pending, not handed out again -- and the budget holds."""
    lab = Lab(tmp_path)
    b, lost, running = killed_after(tmp_path, lab, lost_ends=True, state_after_lost=state_after_lost)
    assert "t6" in b.finished_ids() and setting(lost) not in b.pending()
    rest = drive(b, lab, live=[running], first=8)
    assert all(setting(c) != setting(lost) for _, c in rest)
    settings = [tuple(r.values()) for r in lab.runs.trials.select(["batch_size", "lr", "seed"]).to_pylist()]
    assert len(lab.runs.trial_ids) == 8 and len(set(settings)) == 8  # the budget, no setting run twice
    assert b.decisions()["stop"] == nt.BUDGET_TRIALS and not b.decisions().get("lost")


def run_to_stop(a: AdaptiveSearch, lab: Lab, on_wait=None) -> tuple[list, int, int]:
    """Two trials live, the older finishing first, until FINISHED: the trials still live then, the next trial
    number, and how often suggest said wait (``on_wait(live)`` called each time)."""
    live = [(t, a.suggest(t)) for t in ("t0", "t1")]
    k, waited = 2, 0
    while True:
        tid, cfg = live.pop(0)
        lab.finish(tid, cfg)
        nxt = a.suggest(f"t{k}")
        if nxt == Searcher.FINISHED:
            return live, k, waited
        if isinstance(nxt, dict):
            live.append((f"t{k}", nxt))
        else:
            waited += 1
            if on_wait is not None:
                on_wait(live)
        k += 1


def test_a_goal_met_while_a_trial_runs_waits_for_it(tmp_path):
    """``goal.running: wait`` (the default): the goal met on the finished trials with one still running: no new
    trial (suggest says wait, not FINISHED), and the stop comes once that trial has finished and the goal still
    holds with it in."""
    a, lab = searcher(tmp_path, goal=100.0, trials=60), Lab(tmp_path)  # any width meets it once seeds suffice

    def waiting(live):  # met with a trial running: nothing new is handed out
        last = a.decisions()["refits"][-1]
        assert last["stop"] is None and not last["choices"] and last["trials_pending"] == len(live)
        assert "waiting for 1 running trial(s)" in status_line(a.decisions(), last)

    live, _, waited = run_to_stop(a, lab, waiting)
    assert waited >= 1
    last = a.decisions()["refits"][-1]
    assert last["stop"] == nt.GOAL_MET and last["trials_pending"] == 0 and not live and last["ending"] == []


def test_holding_starts_no_trial_the_expected_stop_would_end(tmp_path):
    """``goal.hold`` (default): once the running trials are expected to meet the goal (here: any width does, and
    they are the seeds it waits for), suggest says wait instead of starting a trial; the refit records it and the
    progress line says why; the goal is then met with nothing running, so ``running: end`` ends nothing."""
    a, lab = searcher(tmp_path, goal=100.0, trials=60, end_running=True), Lab(tmp_path)
    seen = []

    def waiting(live):
        last = a.decisions()["refits"][-1]
        seen.append(last["holding"])
        assert not last["choices"] and last["trials_pending"] == len(live) == 1
        assert status_line(a.decisions(), last).endswith("waiting for 1 running trial(s): expected to meet the goal")

    live, k, waited = run_to_stop(a, lab, waiting)
    assert waited >= 1 and all(seen)
    last = a.decisions()["refits"][-1]
    assert last["stop"] == nt.GOAL_MET and last["ending"] == [] and not live and last["trials_finished"] == k - 1


def test_a_goal_met_while_a_trial_runs_stops_and_ends_it(tmp_path):
    """``goal.running: end``: the goal met on the finished trials with one still running: the sweep stops at once
    (FINISHED), the refit names the running trial as ended (its trials are told through trainables.sweep_signal;
    here, without Ray, there is no one to tell), and the answer is the finished trials'. (``goal.hold: false``: with
    holding the rule would not have started the running trial, test below.)"""
    a, lab = searcher(tmp_path, goal=100.0, trials=60, end_running=True, hold=False), Lab(tmp_path)
    live, k, waited = run_to_stop(a, lab)
    assert waited == 0, "a goal met with a trial running stops; it does not wait"
    rec = a.decisions()
    last = rec["refits"][-1]
    assert last["stop"] == nt.GOAL_MET and last["trials_pending"] == 1 and len(live) == 1
    assert last["ending"] == [live[0][0]] and last["trials_finished"] == k - 1
    assert f"after {k - 1} trials; ending 1 running trial(s) (kept, not fitted)" in status_line(rec, last)
    assert f"`{live[0][0]}`" in "\n".join(markdown_lines(rec)).split("were asked to end")[1]
    # the running trial ends part-way, its rows kept; a resumed sweep with a tighter goal counts it as spent
    tid, cfg = live[0]
    lab.finish(tid, cfg, ended_at=3)
    a.on_trial_complete(tid, {})
    state = tmp_path / "state.json"
    a.save(str(state))
    b = searcher(tmp_path, goal=0.01, trials=60, end_running=True, hold=False)
    b.restore(str(state))
    assert isinstance(b.suggest("r0"), dict)
    assert b.decisions()["refits"][-1]["trials_finished"] == k  # the ended trial's examples and trial count
