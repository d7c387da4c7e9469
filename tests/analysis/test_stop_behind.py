"""stopping.behind's rule (analysis.features.stop_behind.stop_behind): the bound it compares against, what it stops and
what it never stops, and -- on a simulated sweep replayed with the rule on -- that the analysis of what it leaves is the
analysis of the full sweep (issue 44)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from analysis.core import metrics as m
from analysis.features.stop_behind.stop_behind import MARGIN, Curve, _bound, behind, curves_from_runs, setting_of
from analysis.fits import flags as fl
from analysis.fits.sweep_fit import analyze_metric
from tests.oracles.stop_behind_replay import replay
from tests.oracles.synth_shapes import SHAPES
from tests.oracles.synth_sweeps import simulate

LOSS, BIN = m.EVAL_LOSS, m.per_bin(m.EVAL_LOSS_BIN, 0)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_the_bound_holds_every_seeds_replicate_brute_force(k):
    """U >= the mean of every draw (with replacement) of the adjusted residuals mean + r (x - mean), float64."""
    rng = np.random.default_rng(k)
    r = math.sqrt(k / (k - 1))
    for _ in range(50):
        x = rng.normal(5.0, 0.1, k)
        adj = x.mean() + r * (x - x.mean())
        top = max(np.mean(adj[list(d)]) for d in itertools.product(range(k), repeat=k))
        assert top <= _bound(x) + 1e-12
        assert top >= x.max() - 1e-12  # and it is not loose by more than the inflation


def _curve(tid, lr, seed, status, steps, loss, bins=None, b=64):
    c = Curve(tid, b, setting_of({"lr": lr}), seed, status)
    for i, s in enumerate(steps):
        c.add(s, LOSS, loss[i])
        if bins is not None:
            c.add(s, BIN, bins[i])
    return c


def _grid(far_steps=200, far_loss=0.5, best_done=True, fast_mate=None):
    """B = 64, lrs 1..5 (best 3): the best's 3 seeds reached 0.2 at 100 steps (one still running unless
    ``best_done``); every other setting running at ``far_steps`` with loss ``far_loss`` (its neighbours at 0.3)."""
    out = []
    steps = list(range(0, 101, 10))
    for s in range(3):
        status = m.STATUS_REACHED_TARGET if best_done or s else m.STATUS_RUNNING
        out.append(_curve(f"best{s}", 3.0, s, status, steps, np.linspace(1.0, 0.2, len(steps))))
    run = list(range(0, far_steps + 1, 10))
    for lr in (1.0, 2.0, 4.0, 5.0):
        low = 0.3 if lr in (2.0, 4.0) else far_loss
        for s in range(3):
            out.append(_curve(f"lr{lr:g}s{s}", lr, s, m.STATUS_RUNNING, run, np.linspace(1.0, low, len(run))))
    if fast_mate is not None:  # lr 1's seed 2 reached the target early
        st = list(range(0, fast_mate + 1, 10))
        out[-10] = _curve("lr1s2", 1.0, 2, m.STATUS_REACHED_TARGET, st, np.linspace(1.0, 0.19, len(st)))
    return out


def test_far_learning_rates_stop_and_the_best_s_neighbours_run_on():
    got = behind(_grid())
    assert set(got) == {f"lr{lr}s{s}" for lr in ("1", "5") for s in range(3)}
    assert "B=64's lr 3" in got["lr1s0"]


def test_nothing_stops_before_every_seed_of_a_setting_has_reached_the_target():
    assert behind(_grid(best_done=False)) == {}


def test_a_trial_stops_only_past_the_bound_plus_the_margin():
    u = _bound(np.log([100.0, 100.0, 100.0]))
    edge = math.exp(u + MARGIN)
    assert behind(_grid(far_steps=int(edge // 10) * 10)) == {}
    assert behind(_grid(far_steps=int(edge // 10 + 1) * 10))


def test_a_setting_with_a_fast_seed_keeps_its_running_seeds():
    got = behind(_grid(fast_mate=60))  # lr 1's seed 2 reached the target before U: lr 1 could win a replicate
    assert not any(t.startswith("lr1s") for t in got) and "lr5s0" in got


def test_a_trial_ahead_in_a_timestep_bin_runs_on():
    def with_bin(c, low=None):  # the bin's loss follows the global one, or falls to ``low``
        vals = c.values[LOSS] if low is None else np.linspace(1.0, low, len(c.steps))
        return _curve(c.trial_id, c.lr, c.seed, c.status, c.steps, c.values[LOSS], vals)

    curves = [with_bin(c, 0.01 if c.trial_id == "lr5s0" else None) for c in _grid()]
    got = behind(curves)
    assert "lr1s0" in got and not any(t.startswith("lr5s") for t in got)  # lr5s0 leads in the bin; its mates too
    curves = [with_bin(c) for c in _grid()]
    assert "lr5s0" in behind(curves)


def test_one_seed_settings_need_three_known_and_are_compared_with_the_slowest():
    steps = list(range(0, 101, 10))
    known = [_curve(f"k{lr}", lr, 0, m.STATUS_REACHED_TARGET, steps[: n + 1], np.linspace(1, 0.2, n + 1))
             for lr, n in ((2.0, 8), (3.0, 6))]  # fmt: skip
    run = list(range(0, 101, 10))
    far = [_curve(f"far{lr}", lr, 0, m.STATUS_RUNNING, run, np.linspace(1, 0.6, len(run))) for lr in (5.0, 6.0)]
    assert behind(known + far) == {}  # two known: a replicate may draw neither
    third = _curve("k4", 4.0, 0, m.STATUS_REACHED_TARGET, steps[:8], np.linspace(1, 0.2, 8))
    got = behind([*known, third, *far])
    assert set(got) == {"far6.0"}  # lr 5 neighbours lr 4 (a contender); lr 6 is past the slowest known (80)


def test_the_splits_of_a_seed_are_never_stopped():
    curves = _grid()
    twin = _curve("lr1s0-split", 1.0, 0, m.STATUS_RUNNING, list(range(0, 201, 10)), np.linspace(1.0, 0.5, 21))
    got = behind([*curves, twin])
    assert not any(t.startswith("lr1s") for t in got) and "lr5s0" in got


def test_curves_from_runs_keeps_every_evaluation():
    runs = simulate(np.random.default_rng(0), SHAPES["issue"])
    curves = curves_from_runs(runs)
    s = runs.series(LOSS)
    live = runs.status != m.STATUS_DIVERGED  # a diverged one ends at its first non-finite evaluation, as live
    assert sum(len(c.steps) for c, ok in zip(curves, live, strict=True) if ok) == live[s.trial].sum()
    assert {c.status for c in curves} == set(runs.status)
    bad = [c for c, ok in zip(curves, live, strict=True) if not ok]
    assert bad and all(not np.isfinite(c.values[LOSS][-1]) and np.isfinite(c.values[LOSS][:-1]).all() for c in bad)


@pytest.mark.parametrize("metric", [LOSS, BIN])
def test_a_replayed_sweep_with_the_rule_on_gives_the_full_sweep_s_answer(metric):
    """The simulated sweep, its trials started centre-out in lr (the best first) 4 at a time, the rule deciding
    after every evaluation: trials stop, examples are saved, and B_crit, its interval and its flags are those of the
    full sweep at every automatic target (the module's claim 3; on issue 45's simulator shape), but for a
    ``censored_batch_sizes`` flag the stopped sweep may add (the test below), never remove."""
    runs = simulate(np.random.default_rng(1000), SHAPES["issue"])
    lr = runs.trials.column("lr").to_numpy()
    order = sorted(range(len(lr)), key=lambda i: (runs.batch_size[i], abs(np.log2(lr[i] / 1e-3))))
    rep = replay(runs, concurrency=4, order=order)
    assert len(rep.stops) >= 10 and rep.examples_ratio < 0.95
    assert set(rep.runs.status[[runs.trial_ids.index(t) for t in rep.stops]]) == {m.STATUS_BEHIND}
    full = analyze_metric(runs, metric, bootstrap=1000, seed=0)
    cut = analyze_metric(rep.runs, metric, targets=[t["target"] for t in full], bootstrap=1000, seed=0)
    assert len(full) >= 5
    added = 0
    for a, b in zip(full, cut, strict=True):
        assert a["b_crit"] == b["b_crit"] and a["b_crit_ci"] == pytest.approx(b["b_crit_ci"], rel=1e-9)
        # no flag lost; one may be added: a batch size nobody reached where a trial was stopped is censored
        assert set(a["flags"]) <= set(b["flags"]) and set(b["flags"]) - set(a["flags"]) <= {fl.CENSORED_BATCH_SIZES}
        added += a["flags"] != b["flags"]
    assert added <= 1


def test_a_grid_launches_each_batch_size_s_middle_learning_rates_first():
    from analysis.features.stop_behind.stop_behind import centre_first

    cfgs = [{"batch_size": b, "lr": lr, "seed": s} for b in (64, 8) for s in range(2) for lr in (1, 2, 3, 4, 5)]
    got = [(cfgs[i]["batch_size"], cfgs[i]["lr"], cfgs[i]["seed"]) for i in centre_first(cfgs)]
    assert got[:6] == [(64, 3, 0), (64, 3, 1), (64, 2, 0), (64, 2, 1), (64, 4, 0), (64, 4, 1)]
    assert got[9] == (64, 5, 1) and got[10] == (8, 3, 0) and len(got) == len(cfgs)


def test_a_batch_size_none_reached_where_a_trial_stopped_behind_counts_as_censored():
    """A trial stopped behind might have reached a target nobody at its batch size reached (a bin where it leads):
    that batch size is censored (flag ``censored_batch_sizes``), not merely unreached."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from analysis.sources.loaders import runs_from_tables

    runs = simulate(np.random.default_rng(0), SHAPES["issue"])
    full = analyze_metric(runs, LOSS, bootstrap=0, seed=0)
    low = full[-1]["target"]  # the lowest target
    sel = runs.batch_size == 64
    stop_at = {t: 10 for t in np.asarray(runs.trial_ids)[sel]}  # every trial of B = 64 stopped at step 10
    met = runs.metrics
    ids = pc.cast(met.column("trial_id"), pa.string()).to_pylist()
    keep = [s <= stop_at.get(t, 1 << 60) for t, s in zip(ids, met.column("step").to_pylist(), strict=True)]
    status = [m.STATUS_BEHIND if t in stop_at else s for t, s in zip(runs.trial_ids, runs.status, strict=True)]
    trials = runs.trials.set_column(runs.trials.schema.get_field_index("status"), "status", pa.array(status))
    cut = runs_from_tables(trials, met.filter(pa.array(keep)))
    (t,) = analyze_metric(cut, LOSS, targets=[low], bootstrap=0, seed=0)
    assert 64 in [c["batch_size"] for c in t["censored_batch_sizes"]] and 64 not in t["unreached_batch_sizes"]
    assert fl.CENSORED_BATCH_SIZES in t["flags"]


def test_a_comparator_needs_every_seed_the_sweep_will_run():
    """Two of the best's three planned seeds finished: a third, still to come, could raise the bound, so nothing
    stops until it has finished (a grid's configs counted: Seeds.of_configs)."""
    from analysis.features.stop_behind.stop_behind import Seeds

    curves = [c for c in _grid() if c.trial_id != "best2"]
    plan = Seeds.of_configs([{"batch_size": 64, "lr": 3.0, "seed": s} for s in range(3)])
    assert behind(curves) and behind(curves, seeds=plan) == {}
    assert behind(_grid(), seeds=plan)
