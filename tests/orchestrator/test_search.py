"""The per-group Optuna searcher (orchestrator.search.optuna_search) driven directly, without Ray actors: quotas,
ranges, seeding,
routing of results, save/restore mid-search; and one `bcrit sweep` of a small quadratic optuna spec end to end."""

from __future__ import annotations

import collections
import glob
import json
import math
import os

import optuna
import pyarrow.parquet as pq
import pytest

from analysis.core import metrics as M
from orchestrator.cli.main import main
from orchestrator.search.optuna_search import OBJECTIVE, GroupedOptunaSearch, distributions
from orchestrator.specs.sweep_spec import parse_spec
from tests.orchestrator.conftest import kill_sweep_midway, mlflow_runs, quadratic_spec, write_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANGES = {
    "lr": {"low": 1.0e-4, "high": 1.0e-2},
    "warmup_steps": {"low": 0, "high": 100},
    "beta2": {"low": 0.9, "high": 0.999},
    "weight_decay": 1.0e-3,  # a constant: fixed in every group, not searched
}


def optuna_spec(tmp_path, trials: int = 4, seed: int = 0, **nuisance):
    """2 batch sizes; B=64 also as 2 accumulation steps; 2 seeds -> (1 + 2) x 2 = 6 groups."""
    spec = quadratic_spec(
        tmp_path,
        nuisance={"search": "optuna", "trials_per_batch_size": trials, "seed": seed, **(nuisance or RANGES)},
    )
    spec["scientific"]["per_batch_size"] = {64: [{"grad_accum": 1}, {"grad_accum": 2}]}
    spec["fixed"]["seeds"] = [0, 1]
    return parse_spec(spec)


def group_key(cfg: dict) -> tuple:
    return cfg["batch_size"], cfg["micro_batch_size"], cfg["grad_accum"], cfg["num_workers"], cfg["seed"]


def fake_objective(cfg: dict) -> float:
    """Smooth in log lr with its optimum depending on the batch size (as real steps-to-target do)."""
    return 100.0 + 50.0 * abs(math.log(cfg["lr"]) - math.log(1e-3 * cfg["batch_size"] / 32))


def drive(searcher, start: int, stop: int) -> list:
    """Suggest trials t<start>..t<stop-1>, completing each at once; returns the suggestions (FINISHED included)."""
    out = []
    for k in range(start, stop):
        cfg = searcher.suggest(f"t{k}")
        out.append(cfg)
        if isinstance(cfg, dict):
            searcher.on_trial_complete(f"t{k}", {OBJECTIVE: fake_objective(cfg["trial"]), "training_iteration": 3})
    return out


def test_exact_quota_per_group_round_robin_then_finished(tmp_path):
    spec = optuna_spec(tmp_path, trials=4)
    s = GroupedOptunaSearch.from_spec(spec)
    assert len(spec.groups()) == 6 and s.total_trials == 24
    out = drive(s, 0, 30)
    cfgs = [c["trial"] for c in out if isinstance(c, dict)]
    assert len(cfgs) == 24 and out[24:] == [GroupedOptunaSearch.FINISHED] * 6
    counts = collections.Counter(group_key(c) for c in cfgs)
    expected = {(b, s.micro_batch_size, s.grad_accum, s.num_workers, seed) for b, s, seed in spec.groups()}
    assert set(counts) == expected and set(counts.values()) == {4}
    assert len({group_key(c) for c in cfgs[:6]}) == 6  # round robin: every group once before any twice
    assert s._issued == [4] * 6


def test_values_in_ranges_log_and_int_scales(tmp_path):
    dists = distributions(
        {"lr": (1e-4, 1e-2), "weight_decay": (1e-5, 1e-1), "beta2": (0.9, 0.999), "warmup_steps": (0, 100)}
    )
    assert dists["lr"].log and dists["weight_decay"].log and not dists["beta2"].log
    assert isinstance(dists["warmup_steps"], optuna.distributions.IntDistribution)
    assert (dists["warmup_steps"].low, dists["warmup_steps"].high) == (0, 100)

    spec = optuna_spec(tmp_path, trials=20)
    s = GroupedOptunaSearch.from_spec(spec)
    cfgs = [c["trial"] for c in drive(s, 0, 120)]
    for c in cfgs:
        assert 1e-4 <= c["lr"] <= 1e-2 and 0.9 <= c["beta2"] <= 0.999
        assert isinstance(c["warmup_steps"], int) and 0 <= c["warmup_steps"] <= 100
        assert c["weight_decay"] == 1e-3  # the constant
        assert c["target_loss"] == 0.5 and c["max_steps"] == 40 and c["dim"] == 50  # the group's fixed config
    # log scale: first draws of 40 seeds fall below the geometric midpoint 1e-3 about half the time
    # (uniform draws on [1e-4, 1e-2] would do so 9% of the time)
    firsts = [
        GroupedOptunaSearch.from_spec(optuna_spec(tmp_path / f"s{k}", seed=k)).suggest("a")["trial"]["lr"]
        for k in range(40)
    ]
    assert 0.25 < sum(lr < 1e-3 for lr in firsts) / len(firsts) < 0.75


def test_results_routed_to_the_group_study(tmp_path):
    spec = optuna_spec(tmp_path, trials=3)
    s = GroupedOptunaSearch.from_spec(spec)
    cfg = s.suggest("a")["trial"]
    s.on_trial_result("a", {OBJECTIVE: 150.0, "training_iteration": 1})
    s.on_trial_result("a", {"training_iteration": 2})  # without the metric: ignored, not a KeyError
    s.on_trial_complete("a", {OBJECTIVE: 120.0, "training_iteration": 2})
    s.suggest("b")
    s.on_trial_complete("b", error=True)
    s.on_trial_complete("unknown", {OBJECTIVE: 1.0})  # a trial this searcher never issued: ignored
    studies = s.studies()
    (a,) = studies[0].trials
    assert a.state == optuna.trial.TrialState.COMPLETE and a.value == 120.0 and a.params["lr"] == cfg["lr"]
    assert a.intermediate_values == {1: 150.0}
    (b,) = studies[1].trials
    assert b.state == optuna.trial.TrialState.FAIL
    assert all(not st.trials for st in studies[2:])


def test_seeded_reproducibility(tmp_path):
    def lrs(seed, run):
        s = GroupedOptunaSearch.from_spec(optuna_spec(tmp_path / run, trials=8, seed=seed))
        return [(group_key(c["trial"]), c["trial"]["lr"], c["trial"]["warmup_steps"]) for c in drive(s, 0, 48)]

    assert lrs(3, "a") == lrs(3, "b")
    assert lrs(3, "c") != lrs(4, "d")


def test_save_restore_mid_search_continues_with_remaining_quota(tmp_path):
    spec = optuna_spec(tmp_path, trials=5)
    reference = GroupedOptunaSearch.from_spec(optuna_spec(tmp_path / "uninterrupted", trials=5))
    full = drive(reference, 0, 17)
    pending = reference.suggest("t17")  # in flight when the driver dies
    reference.on_trial_complete("t17", {OBJECTIVE: fake_objective(pending["trial"]), "training_iteration": 3})
    full += [pending, *drive(reference, 18, 32)]

    first = GroupedOptunaSearch.from_spec(spec)
    head = drive(first, 0, 17)
    assert first.suggest("t17") == pending
    path = str(tmp_path / "searcher-state.pkl")
    first.save(path)

    resumed = GroupedOptunaSearch.from_spec(spec)  # what Tuner.restore unpickles: the searcher as first built
    resumed.restore(path)
    assert resumed._issued == first._issued and sum(resumed._issued) == 18
    resumed.on_trial_complete("t17", {OBJECTIVE: fake_objective(pending["trial"]), "training_iteration": 3})
    tail = drive(resumed, 18, 32)
    assert head + [pending] + tail == full  # same suggestions: nothing re-issued, nothing lost, same samplers
    assert full[30:] == [GroupedOptunaSearch.FINISHED] * 2 and resumed._issued == [5] * 6
    assert all(len(st.trials) == 5 for st in resumed.studies())
    assert all(t.state == optuna.trial.TrialState.COMPLETE for st in resumed.studies() for t in st.trials)

    other = GroupedOptunaSearch.from_spec(optuna_spec(tmp_path, trials=6))
    with pytest.raises(ValueError, match="another sweep spec"):
        other.restore(path)


def test_restore_recounts_quotas_from_the_trials_tune_restores(tmp_path):
    """Tune uploads the searcher state and its trial list one after the other: a driver killed in between leaves
    them out of step. The quotas follow the trial list Tune restores, in both directions."""
    spec = optuna_spec(tmp_path, trials=3)
    first = GroupedOptunaSearch.from_spec(spec)
    suggested = {f"t{j}": first.suggest(f"t{j}") for j in range(8)}
    older = str(tmp_path / "older.pkl")
    first.save(older)  # the searcher state uploaded before t8 was suggested
    suggested["t8"] = first.suggest("t8")
    tune_knows = {tid: c for tid, c in suggested.items() if tid != "t3"}  # t8 in Tune's list, t3 lost by Tune

    resumed = GroupedOptunaSearch.from_spec(spec)
    resumed.restore(older)
    resumed.reconcile(tune_knows)
    group_of = {tid: resumed.group_index(c["trial"]) for tid, c in suggested.items()}
    expected = [sum(1 for tid in tune_knows if group_of[tid] == i) for i in range(6)]
    assert resumed._issued == expected and sum(expected) == 8
    tail = [resumed.suggest(f"n{j}") for j in range(3 * 6 - 8 + 1)]
    assert tail[-1] == GroupedOptunaSearch.FINISHED and resumed._issued == [3] * 6  # quota met, no more, no less
    # t8 (unknown to the restored study) is told to its study when it completes, without a KeyError
    resumed.on_trial_result("t8", {OBJECTIVE: 5.0, "training_iteration": 1})
    resumed.on_trial_complete("t8", {OBJECTIVE: 5.0, "training_iteration": 1})
    study = resumed.studies()[group_of["t8"]]
    assert any(t.value == 5.0 and t.params["lr"] == suggested["t8"]["trial"]["lr"] for t in study.trials)
    resumed.on_trial_complete("t0", {OBJECTIVE: 7.0, "training_iteration": 1})  # a trial both knew: as before
    assert resumed.group_index({"batch_size": -1}) is None


def test_restore_counts_a_trial_that_ended_after_tunes_last_save(tmp_path):
    """A trial suggested and ended between Tune's last save of its trial list and the kill: Tune never runs it
    again, its study holds its result (and the tables its final row), so it counts towards its group's quota: the
    group gets no trial too many. One lost while running is replaced (its records go:
    orchestrator.records.lost_trials)."""
    spec = optuna_spec(tmp_path, trials=3)
    first = GroupedOptunaSearch.from_spec(spec)
    suggested = {f"t{j}": first.suggest(f"t{j}") for j in range(8)}
    first.on_trial_complete("t7", {OBJECTIVE: 5.0, "training_iteration": 1})  # started and ended after the save
    tune_knows = {tid: c for tid, c in suggested.items() if tid not in ("t6", "t7")}  # t6: lost while running

    resumed = GroupedOptunaSearch.from_spec(spec)  # what Tuner.restore unpickles; the studies from the journal
    resumed.reconcile(tune_knows)
    group_of = {tid: resumed.group_index(c["trial"]) for tid, c in suggested.items()}
    expected = [sum(1 for tid in [*tune_knows, "t7"] if group_of[tid] == i) for i in range(6)]
    assert resumed._issued == expected and sum(expected) == 7
    tail = [resumed.suggest(f"n{j}") for j in range(3 * 6 - 7 + 1)]
    assert tail[-1] == GroupedOptunaSearch.FINISHED and resumed._issued == [3] * 6  # t6's place taken, not t7's
    study = resumed.studies()[group_of["t7"]]
    assert [t.value for t in study.trials if t.user_attrs.get("tune_trial_id") == "t7"] == [5.0]  # told once


@pytest.mark.ray
def test_bcrit_sweep_optuna_end_to_end(tmp_path, ray_local, no_ray_address):
    spec = quadratic_spec(
        tmp_path, nuisance={"search": "optuna", "lr": {"low": 0.2, "high": 1.5}, "trials_per_batch_size": 3}
    )
    spec["fixed"].update(report_every=20, checkpoint_every=40)  # 2 reports per trial: the driver's work is per report
    assert main(["sweep", write_spec(tmp_path, spec)]) == 0
    rows = pq.read_table(os.path.join(tmp_path, "sweep", "trials.parquet")).to_pylist()
    assert collections.Counter(r["batch_size"] for r in rows) == {16: 3, 64: 3}
    assert len({r["trial_id"] for r in rows}) == 6
    assert all(0.2 <= r["lr"] <= 1.5 for r in rows)
    assert all(len({r["lr"] for r in rows if r["batch_size"] == b}) == 3 for b in (16, 64))
    (state,) = glob.glob(os.path.join(tmp_path, "sweep", "tune", "searcher-state-*.pkl"))  # what Tuner.restore reads
    with open(state) as f:  # JSON despite the name Tune gives it; the studies are in the journal
        assert sum(json.load(f)["issued"]) == 6
    assert os.path.isfile(os.path.join(tmp_path, "sweep", "optuna-journal.log"))
    assert all(r["status"] in M.FINAL_STATUSES and r["status"] != M.STATUS_FAILED for r in rows)


@pytest.mark.ray
@pytest.mark.slow  # ~1-2 min; the fast check of the same restore is test_save_restore_mid_search_continues_...
def test_bcrit_sweep_optuna_resume_end_to_end(tmp_path, ray_local, no_ray_address):
    """`bcrit sweep` of an Optuna search killed mid-search, then `--resume`: every group ends with exactly its quota
    of distinct trials, none repeated, none lost, each tracked once."""
    spec = quadratic_spec(
        tmp_path, nuisance={"search": "optuna", "lr": {"low": 0.2, "high": 1.5}, "trials_per_batch_size": 3}
    )
    spec["fixed"].update(report_every=10, checkpoint_every=10)
    assert kill_sweep_midway(tmp_path, write_spec(tmp_path, spec), parts_needed=5) >= 5
    assert main(["sweep", str(tmp_path / "sweep"), "--resume"]) == 0
    rows = pq.read_table(os.path.join(tmp_path, "sweep", "trials.parquet")).to_pylist()
    assert collections.Counter(r["batch_size"] for r in rows) == {16: 3, 64: 3}  # the quota, no more, no less
    assert len({r["trial_id"] for r in rows}) == 6
    assert all(len({r["lr"] for r in rows if r["batch_size"] == b}) == 3 for b in (16, 64))  # no repeated suggestion
    assert all(0.2 <= r["lr"] <= 1.5 for r in rows)
    assert all(r["status"] in M.FINAL_STATUSES and r["status"] != M.STATUS_FAILED for r in rows)
    _, parents, children = mlflow_runs(str(tmp_path / "sweep"))
    assert len(parents) == 1
    assert sorted(c.data.tags["trial_id"] for c in children) == sorted(r["trial_id"] for r in rows)


@pytest.mark.parametrize(
    ("name", "groups", "trials"), [("quadratic-optuna.yaml", 4, 32), ("dit-s2-imagenet.yaml", 16, 96)]
)
def test_example_specs(tmp_path, name, groups, trials):
    from orchestrator.specs.sweep_spec import load_spec

    spec = load_spec(os.path.join(ROOT, "examples", name), sweep_dir=str(tmp_path))
    s = GroupedOptunaSearch.from_spec(spec)
    assert spec.search == "optuna" and isinstance(spec.nuisance["lr"], tuple)
    assert len(spec.groups()) == groups and s.total_trials == trials


def test_num_trials_counts_every_optuna_group():
    from pathlib import Path

    from orchestrator.specs.sweep_spec import load_spec

    spec = load_spec(str(Path(__file__).parents[2] / "examples" / "dit-s2-imagenet.yaml"), [])
    assert spec.num_trials() == len(spec.groups()) * spec.trials_per_batch_size


def test_search_state_is_data_and_a_pickle_is_refused_unopened(tmp_path):
    """The studies live in Optuna's journal (JSON lines) in the sweep dir; the searcher state Tune saves is JSON; a
    pickled state (an older bcrit's, or a crafted file) is refused without being unpickled."""
    import json
    import pickle

    spec = optuna_spec(tmp_path, trials=2)
    s = GroupedOptunaSearch.from_spec(spec)
    drive(s, 0, 3)
    path = str(tmp_path / "searcher-state-x.pkl")
    s.save(path)
    with open(path) as f:
        assert json.load(f)["issued"] == s._issued
    with open(os.path.join(spec.sweep_dir, "optuna-journal.log")) as f:
        assert all(json.loads(line) for line in f)
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with open(path, "wb") as f:
        pickle.dump({"_issued": Payload()}, f)
    with pytest.raises(ValueError, match="not a bcrit searcher state"):
        GroupedOptunaSearch.from_spec(spec).restore(path)
    assert not marker.exists()
