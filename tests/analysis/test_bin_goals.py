"""Per-timestep-bin goals of the adaptive sweep (``Goal.bins``; analysis.features.adaptive.bin_goals) on synthetic
sweeps whose bins have known, different B_crit (tests/oracles/synth_runs.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from analysis.features.adaptive import narrowing
from analysis.features.adaptive import next_trials as nt
from analysis.features.adaptive.bin_goals import NO_FIT
from analysis.fits.answer import bins_at
from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import runs_from_tables
from tests.oracles.synth_runs import synth_runs

BS = (32, 64, 128, 256, 512, 1024, 2048)
LF = (0.25, 0.5, 1.0, 2.0, 4.0)
E_MIN = 200.0 * 256  # global B_crit 256
# bin 0 like the global loss; bin 1's B_crit 6x (near the top of the batch sizes: a wider interval); bin 2's 64x
# (beyond every batch size: the analysis flags it `extrapolated`)
BIN_E_MIN = (E_MIN, 6 * E_MIN, 64 * E_MIN)
SPACE = nt.Space(BS, tuple(1e-3 * f for f in LF), max_seeds=3)
TARGET = 0.3


def _runs(seed: int = 0, bins: int = 3, **kw):
    """A full grid, 2 seeds per setting, trials stopped at 0.2; one lr grid at every batch size (the rule's Space)."""
    r = synth_runs(np.random.default_rng(seed), batch_sizes=BS, lr_factors=LF, seeds=2, sigma=0.1, stop_at=0.2,
                   bins=bins, bin_e_min=BIN_E_MIN[:bins] if bins else None, **kw)  # fmt: skip
    factor = r.trials.column("lr").to_numpy() / np.sqrt(r.batch_size / 256)  # synth scales lr with sqrt(B)
    i = r.trials.schema.get_field_index("lr")
    trials = r.trials.set_column(i, r.trials.schema.field(i), pa.array(1e-3 * np.round(factor / 1e-3, 6)))
    return runs_from_tables(trials, r.metrics, source="synthetic")


def _without(runs, lr: float, seed: int):
    """The runs without the trials of one (lr, seed) at every batch size."""
    lrs, seeds = runs.trials.column("lr").to_numpy(), runs.trials.column("seed").to_numpy()
    keep = [t for t, x, s in zip(runs.trial_ids, lrs, seeds, strict=True) if not (abs(x - lr) < 1e-12 and s == seed)]
    ids = pa.array(keep)
    pick = [pc.is_in(pc.cast(t.column("trial_id"), pa.string()), ids) for t in (runs.trials, runs.metrics)]
    trials, metrics = runs.trials.filter(pick[0]), runs.metrics.filter(pick[1])
    i = trials.schema.get_field_index("trial_id")
    trials = trials.set_column(i, "trial_id", pc.cast(trials.column(i), pa.string()))
    j = metrics.schema.get_field_index("trial_id")
    metrics = metrics.set_column(j, "trial_id", pc.cast(metrics.column(j), pa.string()))
    return runs_from_tables(trials, metrics, source="synthetic")


def _decide(runs, rel_ci: float, bins: bool, bootstrap: int = 200) -> nt.Decision:
    goal = nt.Goal((TARGET,), rel_ci, bins=bins)
    return nt.next_trials(runs, SPACE, goal, nt.Budget(trials=500), bootstrap=bootstrap)


def _met_goal(runs, probe: nt.Decision) -> float:
    """A goal just above every counted width of the 200-resample refit (``probe``) and of the 1000-resample one
    that confirms a stop: the goal is met on both."""
    widths = []
    for dec in (probe, _decide(runs, 1e-3, True, bootstrap=nt.CONFIRM_BOOTSTRAP)):
        widths += [dec.widths[TARGET]] + [b.width for b in dec.bins if b.counted]
    return max(widths) * 1.01


@pytest.fixture(scope="module")
def runs():
    return _runs()


@pytest.fixture(scope="module")
def probe(runs):
    """The refit with bins at a goal nothing meets: the widths the tests set their goals between."""
    return _decide(runs, 1e-3, True)


def test_each_bin_is_fitted_at_its_matched_target_as_the_report_answers(runs, probe):
    assert [(b.bin, b.target) for b in probe.bins] == [(0, TARGET), (1, TARGET), (2, TARGET)]
    # the same estimator as bcrit analyze's per-bin answer (analysis.fits.answer.bins_at), same bootstrap settings
    want = bins_at(runs, "eval/loss", probe.fits[0], [0, 1, 2], {0: [0, 332], 1: [333, 665], 2: [666, 999]},
                   analyze_metric, dict(bootstrap=200, seed=0, level=0.9))  # fmt: skip
    for got, ref in zip(probe.bins, want, strict=True):
        assert got.bin_target == ref["target"] and got.timesteps == tuple(ref["timesteps"])
        assert got.fit["b_crit_ci"] == ref["entry"]["b_crit_ci"] and list(got.flags) == ref["entry"]["flags"]


def test_global_goal_met_but_a_trusted_bin_wider_does_not_stop(runs, probe):
    glob = probe.widths[TARGET]
    counted = [b for b in probe.bins if b.counted]
    wide = max(counted, key=lambda b: b.width)
    assert wide.bin == 1 and glob < wide.width  # the set-up: bin 1 (B_crit near the top) is the widest
    rel_ci = (glob + wide.width) / 2
    assert _decide(runs, rel_ci, False).stop == nt.GOAL_MET  # the global answer alone meets the goal
    dec = _decide(runs, rel_ci, True)
    assert dec.stop is None and dec.choices  # ...but bin 1 does not: the sweep goes on
    label, width = dec.widest()
    assert label == "bin t=333-665 at 0.3" and width == pytest.approx(wide.width)
    assert "widest bin t=333-665 at 0.3" in dec.summary()
    # scored by what it does to bin 1, the one interval still open: its expected narrowing of bin 1's
    # linearized fit per expected example (the global interval, met, no longer counts)
    c = dec.choices[0]
    mdl = narrowing._Model(wide.fit, narrowing._sigma2(runs, wide.fit, wide.metric))
    assert c.kind in ("seed", "lr_refine") and c.score == pytest.approx(mdl.narrowing(c.trial.batch_size) / c.examples)


def test_untrusted_bin_is_reported_and_not_counted(runs, probe):
    bad = [b for b in probe.bins if not b.counted]
    assert [b.bin for b in bad] == [2] and "extrapolated" in bad[0].flags  # B_crit beyond every batch size
    assert bad[0].width > max(b.width for b in probe.bins if b.counted)
    rel_ci = _met_goal(runs, probe)
    dec = _decide(runs, rel_ci, True)
    assert dec.stop == nt.GOAL_MET  # bin 2 is wider than the goal, but the analysis does not trust it
    # (the stop's confirming refit may flag another bin too, e.g. coarse_lr_grid, which depends on the interval)
    assert "untrusted bins: " in dec.summary() and "t=666-999 at 0.3 (extrapolated" in dec.summary()
    assert dec.bins[2].record()["counted"] is False and dec.bins[2].record()["flags"] == list(bad[0].flags)


def test_bin_goal_needs_min_seeds_at_the_bins_own_points():
    # bin 0's best lr is 2x the global one; that lr lost its seed 1 at every batch size: the global points keep
    # 2 seeds, bin 0's have 1
    runs = _without(_runs(bin_lr_opt=(1.0, 0.0, 0.0)), 2e-3, 1)
    probe = _decide(runs, 1e-3, True)
    b0 = probe.bins[0]
    assert b0.counted and {p["seeds"] for p in b0.fit["points"]} == {1}
    assert {p["seeds"] for p in probe.fits[0]["points"]} == {2}
    rel_ci = _met_goal(runs, probe)
    assert _decide(runs, rel_ci, False).stop == nt.GOAL_MET
    dec = _decide(runs, rel_ci, True)  # every counted width within the goal, but bin 0 rests on single seeds
    assert dec.stop is None and dec.choices[0].kind == "seed" and dec.choices[0].trial.lr == pytest.approx(2e-3)


def test_bins_asked_but_none_reported_never_meets_the_goal():
    runs = _runs(bins=0)
    dec = _decide(runs, 0.99, True)
    assert dec.bins == [] and dec.stop is None
    assert _decide(runs, 0.99, False).stop == nt.GOAL_MET


def test_a_bin_without_a_fit_is_flagged_no_fit(runs, probe, monkeypatch):
    from analysis.features.adaptive import bin_goals

    monkeypatch.setattr(bin_goals, "matched_bin_target", lambda *a: None)  # no trial crosses: no matched target
    got = bin_goals.bin_intervals(runs, probe.fits, "eval/loss", 20, 0, 0.9)
    assert all(b.flags == (NO_FIT,) and not b.counted and b.width == np.inf for b in got)
