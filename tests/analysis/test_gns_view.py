"""B_simple beside B_crit: offline re-smoothing (the live values' window rule) read off at the crossing step.

Known answers: a noise-free stream (every raw ``|G_b|^2``, ``|G_B|^2`` is its exact expectation) with ``|G|^2 = 4``
up to step 100 and ``1`` after, ``tr(Sigma) = 40``; global rows every step, bin 0 every 5 steps. With a window of 20
steps the value at each step is a hand count of 4s and 1s, the same for the global and the per-bin stream, and the
SE follows from the spread of those 4s and 1s.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.core import gns
from analysis.core import metrics as m
from analysis.fits.gns_view import (
    GNSTrace,
    attach_b_simple,
    b_simple_at,
    b_simple_trace,
    bins_in,
    gns_names,
    half_of,
    pooled_b_simple,
    window_of,
)
from analysis.sources.loaders import runs_from_tables
from analysis.sources.schema import metrics_table, trials_table
from tests.oracles.synth_runs import synth_runs

TRACE, B_SMALL, B_BIG = 40.0, 16, 64


def _g2(step: np.ndarray) -> np.ndarray:
    return np.where(step <= 100, 4.0, 1.0)


def _step_runs(window_column: list | None = None, bin_trace: float = TRACE, edit=None, half_column: list | None = None):
    """Two trials with the known stream (the second one's rows shifted by nothing: same numbers). Bin 0's
    ``tr(Sigma)`` is ``bin_trace``; ``edit(trial_id, k, metric, steps, values) -> (steps, values)`` alters rows."""
    ids = ["a", "b"]
    trial_cols = {
        "trial_id": ids,
        "batch_size": [64, 64],
        "micro_batch_size": [16, 16],
        "grad_accum": [4, 4],
        "num_workers": [1, 1],
        "lr": [1e-3, 1e-3],
        "seed": [0, 1],
        "status": [m.STATUS_BUDGET_SPENT] * 2,
    }
    if window_column is not None:
        trial_cols["gns_window"] = window_column
    if half_column is not None:
        trial_cols["gns_window_half"] = half_column
    cols: dict[str, list] = {k: [] for k in ("trial_id", "step", "examples", "metric", "value")}
    for tid in ids:
        for k, steps in [(None, np.arange(1, 201)), (0, np.arange(5, 201, 5))]:
            g2, tr = _g2(steps), TRACE if k is None else bin_trace
            vals = [g2 + tr / B_SMALL, g2 + tr / B_BIG, np.full(steps.size, B_SMALL), np.full(steps.size, B_BIG)]
            for name, v in zip(gns_names(k), vals, strict=True):
                s, v = (steps, np.asarray(v, dtype=float)) if edit is None else edit(tid, k, name, steps, v)
                cols["trial_id"] += [tid] * s.size
                cols["step"] += s.tolist()
                cols["examples"] += (64 * s).tolist()
                cols["metric"] += [name] * s.size
                cols["value"] += np.asarray(v, dtype=float).tolist()
    return runs_from_tables(trials_table(trial_cols), metrics_table(cols), source="known")


def _hand(n4: int, n1: int) -> tuple[float, float]:
    """B_simple and its delta-method SE for a window of n4 measurements with |G|^2 = 4 and n1 with 1, tr = 40."""
    n = n4 + n1
    mean = (4 * n4 + n1) / n
    var = (n4 * (4 - mean) ** 2 + n1 * (1 - mean) ** 2) / (n - 1)  # tr is constant: only |G|^2 spreads
    r = TRACE / mean
    return r, r * math.sqrt(var / n) / mean


@pytest.mark.parametrize("k", [None, 0])
def test_known_answer_global_and_per_bin_share_the_window_in_steps(k) -> None:
    tr = b_simple_trace(_step_runs(), 0, k, window=20)
    at = dict(zip(tr.step.tolist(), zip(tr.b_simple.tolist(), tr.se.tolist(), strict=True), strict=True))
    per = 1 if k is None else 5  # measurements per step
    # step 105: the window (85, 105] holds 15 steps at |G|^2 = 4 and 5 at 1, i.e. 3 and 1 per-bin measurements
    for step, (n4, n1) in {105: (15, 5), 110: (10, 10), 120: (0, 20)}.items():
        value, se = _hand(n4 // per, n1 // per)
        assert at[step][0] == pytest.approx(value, rel=1e-12)
        assert at[step][1] == pytest.approx(se, rel=1e-12, abs=1e-12)
    assert at[110][0] == pytest.approx(16.0) and at[200][0] == pytest.approx(40.0) and at[200][1] == 0.0
    assert at[100][0] == pytest.approx(10.0)  # a window entirely before the change
    if k is None:
        assert math.isnan(at[1][0])  # one measurement: warming, no value


def test_the_trials_own_window_is_used() -> None:
    runs = _step_runs(window_column=[20, 40])
    assert window_of(runs, 0) == 20 and window_of(runs, 1) == 40
    assert window_of(_step_runs(), 0) == gns.DEFAULT_WINDOW  # no column: the default
    assert window_of(_step_runs(window_column=["40", "0"]), 0) == 40  # MLflow params arrive as strings
    assert window_of(_step_runs(window_column=["40", "0"]), 1) == gns.DEFAULT_WINDOW
    a = b_simple_trace(runs, 0)
    b = b_simple_trace(runs, 1)
    i = int(np.searchsorted(a.step, 120))
    assert a.b_simple[i] == pytest.approx(40.0)  # (100, 120]: all after the change
    assert b.b_simple[i] == pytest.approx(_hand(20, 20)[0])  # (80, 120]: half before
    targets = [{"points": [{"trial_id": t, "steps": 120.0, "batch_size": 64} for t in ("a", "b")]}]
    attach_b_simple(runs, targets)
    assert [p["b_simple"] for p in targets[0]["points"]] == pytest.approx([40.0, 16.0])
    # the target weighs the two points equally: a's (100, 120] (20 steps at |G|^2 = 1: mean 1), b's (80, 120] (20 at
    # 4, 20 at 1: mean 2.5); tr = 40 throughout, so only b's |G|^2 spreads (±1.5 about its mean, 40 of 58 dof)
    r = TRACE / 1.75
    se = r * math.sqrt(40 * 1.5**2 / 58 * (1 / 20 + 1 / 40) / 4) / 1.75
    assert targets[0]["b_simple"] == pytest.approx(r, rel=1e-12)
    assert targets[0]["b_simple_se"] == pytest.approx(se, rel=1e-12)


@pytest.mark.parametrize("half", [[1.0, 0.0], ["True", "False"], ["1.0", "0.0"]])
def test_the_trials_own_half_rule_is_used_for_the_global_window_only(half) -> None:
    """gns_window_half (runs table column; floats from trials.parquet, strings from MLflow params): at step 120 with a
    100-step window the global window is (60, 120] (40 steps at |G|^2 = 4, 20 at 1) instead of (20, 120] (80 and 20);
    per-bin windows keep the plain rule, as live; a table without the column is the plain rule (older trials)."""
    runs = _step_runs(window_column=[100, 100], half_column=half)
    assert half_of(runs, 0) and not half_of(runs, 1) and not half_of(_step_runs(), 0)
    at = {r: b_simple_trace(runs, r) for r in (0, 1)}
    i = int(np.searchsorted(at[0].step, 120))
    assert at[0].b_simple[i] == pytest.approx(_hand(40, 20)[0], rel=1e-12)
    assert at[0].se[i] == pytest.approx(_hand(40, 20)[1], rel=1e-12)
    assert at[1].b_simple[i] == pytest.approx(_hand(80, 20)[0], rel=1e-12)
    per_bin = b_simple_trace(runs, 0, 0)
    j = int(np.searchsorted(per_bin.step, 120))
    assert per_bin.b_simple[j] == pytest.approx(_hand(16, 4)[0], rel=1e-12)  # (20, 120] every 5 steps: 16 and 4


def test_window_falls_back_to_the_default_only_without_a_positive_number() -> None:
    for column in ([None, 1], ["", "1"]):  # a trial without the param (or an empty one), one with a 1-step window
        runs = _step_runs(window_column=column)
        assert window_of(runs, 0) == gns.DEFAULT_WINDOW and window_of(runs, 0, default=30) == 30
        assert window_of(runs, 1) == 1 and window_of(runs, 1, default=30) == 1


def _drop(steps: dict[str, int]):
    """An ``edit`` that removes trial a's global row of each named metric at the given step."""

    def edit(tid, k, name, s, v):
        keep = (s != steps.get(name)) | (tid != "a") | (k is not None)
        return s[keep], np.asarray(v, dtype=float)[keep]

    return edit


def _overflow(steps: dict[str, int]):
    """An ``edit`` that makes trial a's global value of each named metric non-finite at the given step."""

    def edit(tid, k, name, s, v):
        v = np.asarray(v, dtype=float).copy()
        if tid == "a" and k is None and name in steps:
            v[s == steps[name]] = np.inf if name == m.GNS_G2_SMALL else np.nan
        return s, v

    return edit


@pytest.mark.parametrize("edit", [_drop, _overflow])
def test_incomplete_measurements_are_left_out(edit) -> None:
    """A step where only |G_b|^2 is missing (or non-finite) and another where only |G_B|^2 is: both steps are left
    out, the rest stay aligned. At step 110 the window (90, 110] then holds 10 steps at |G|^2 = 4 and 8 at 1."""
    runs = _step_runs(edit=edit({m.GNS_G2_SMALL: 103, m.GNS_G2_BIG: 107}))
    tr = b_simple_trace(runs, 0, window=20)
    assert tr is not None and tr.step.size == 198 and 103 not in tr.step and 107 not in tr.step
    at = dict(zip(tr.step.tolist(), zip(tr.b_simple.tolist(), tr.se.tolist(), strict=True), strict=True))
    assert at[110][0] == pytest.approx(_hand(10, 8)[0], rel=1e-12)
    assert at[110][1] == pytest.approx(_hand(10, 8)[1], rel=1e-12)
    assert at[100][0] == pytest.approx(10.0) and at[130][0] == pytest.approx(40.0)


def test_attach_b_simple_uses_the_bin_and_window_it_is_given() -> None:
    """Bin 0's tr(Sigma) is twice the global one; the trials' own windows are 20 and 40 steps. At step 120 the
    global value over 20 steps is 40 (all after the change), over 40 steps 16 (half before); bin 0's are doubled."""
    runs = _step_runs(window_column=[20, 40], bin_trace=2 * TRACE)

    def attach(k, window):
        targets = [{"points": [{"trial_id": t, "steps": 120.0, "batch_size": 64} for t in ("a", "b")]}]
        attach_b_simple(runs, targets, k, window)
        return [p["b_simple"] for p in targets[0]["points"]] + [targets[0]["b_simple"]]

    # the target: mean tr over the points' mean |G|^2 (1 in a 20-step window at 120, 2.5 in a 40-step one)
    assert attach(None, None) == pytest.approx([40.0, 16.0, 40 / 1.75])  # each trial's own window
    assert attach(0, None) == pytest.approx([80.0, 32.0, 80 / 1.75])
    assert attach(None, 40) == pytest.approx([16.0, 16.0, 16.0])
    assert attach(0, 20) == pytest.approx([80.0, 80.0, 80.0])


@pytest.mark.parametrize("edit", [_drop, _overflow])
def test_pooled_b_simple_leaves_incomplete_measurements_out(edit) -> None:
    """As ``b_simple_trace``: trial a's window (90, 110] without steps 103 (|G_b|^2 missing or non-finite) and 107
    (|G_B|^2) holds 10 steps at |G|^2 = 4 and 8 at 1."""
    runs = _step_runs(edit=edit({m.GNS_G2_SMALL: 103, m.GNS_G2_BIG: 107}))
    est = pooled_b_simple(runs, [{"trial_id": "a", "steps": 110.0}], window=20)
    assert est.n == 18
    assert (est.value, est.se) == pytest.approx(_hand(10, 8), rel=1e-12)


def test_pooled_b_simple_halves_the_global_window_only_and_needs_two_batch_sizes() -> None:
    """With gns_window_half the global window at step 120 (100 steps) is (60, 120]: 40 steps at |G|^2 = 4 and 20 at 1;
    without, (20, 120]: 80 and 20; bin 0 keeps the plain window, (20, 120] every 5 steps: 16 and 4. A trial whose two
    batch sizes are equal (b == B) gives no measurement."""
    runs = _step_runs(window_column=[100, 100], half_column=[1.0, 0.0])
    for tid, (n4, n1) in (("a", (40, 20)), ("b", (80, 20))):
        est = pooled_b_simple(runs, [{"trial_id": tid, "steps": 120.0}])
        assert est.n == n4 + n1 and (est.value, est.se) == pytest.approx(_hand(n4, n1), rel=1e-12)
    est = pooled_b_simple(runs, [{"trial_id": "a", "steps": 120.0}], k=0)
    assert est.n == 20 and (est.value, est.se) == pytest.approx(_hand(16, 4), rel=1e-12)

    def same_sizes(tid, k, name, steps, v):
        return steps, (np.full(steps.size, float(B_SMALL)) if name == m.GNS_B_BIG else v)

    est = pooled_b_simple(_step_runs(edit=same_sizes), [{"trial_id": "a", "steps": 120.0}])
    assert not est.ok and est.n == 0


@pytest.fixture(scope="module")
def runs():
    return synth_runs(np.random.default_rng(2), seeds=1, bins=2, gns=True, lr_factors=(1.0,))


def test_names_and_bins(runs):
    assert gns_names() == (m.GNS_G2_SMALL, m.GNS_G2_BIG, m.GNS_B_SMALL, m.GNS_B_BIG)
    assert gns_names(1)[0] == "gns/bin1/g2_small"
    assert bins_in(runs, "gns/") == [0, 1]
    assert bins_in(runs, m.EVAL_LOSS + "/") == [0, 1]
    assert b_simple_trace(runs, 0, 7) is None  # no such bin


def test_b_simple_at_interpolates_and_clamps():
    tr = GNSTrace(np.array([0, 10, 20]), np.array([1.0, 3.0, np.nan]), np.array([0.1, 0.1, np.nan]))
    assert b_simple_at(tr, 5) == pytest.approx(2.0)
    assert b_simple_at(tr, 50) == pytest.approx(3.0)
    assert np.isnan(b_simple_at(None, 5)) and np.isnan(b_simple_at(tr, np.inf))


def test_attach_b_simple_recovers_the_synthetic_noise_scale(runs):
    # synthetic |G|^2 = 10 (L - 0.1), tr(Sigma) = 100, so B_simple = 10 / (L - 0.1) at loss L
    row = len(runs.trial_ids) - 1
    ev = runs.series(m.EVAL_LOSS)
    sel = ev.trial == row
    gap = int(np.diff(ev.step[sel])[0])
    step = float(np.interp(0.3, ev.value[sel][::-1], ev.step[sel][::-1]))  # the loss falls: reverse for interp
    targets = [{"points": [{"trial_id": runs.trial_ids[row], "steps": step, "batch_size": 1}]}]
    attach_b_simple(runs, targets, None, window=2 * gap)  # two measurements per window: little smoothing
    assert targets[0]["b_simple"] == pytest.approx(10 / (0.3 - 0.1), rel=0.3)
    assert targets[0]["points"][0]["b_simple"] == pytest.approx(10 / (0.3 - 0.1), rel=0.3)


def test_pooled_b_simple_pools_every_seed_of_a_point_and_the_bins_plain_window() -> None:
    """A point's ``trial_ids`` (its seeds) are one stratum: a and b as two seeds of one point are the plain pooled
    window rule over both windows (60 measurements, 20 at |G|^2 = 4); bin 0 (every 5 steps, the plain window even
    where the global one is halved) at step 120 with 40-step windows: (80, 120] holds 4 measurements at 4 and 4 at 1
    in each trial."""
    runs = _step_runs(window_column=[20, 40], half_column=[1.0, 1.0])
    one = pooled_b_simple(runs, [{"trial_id": "a", "trial_ids": ["a", "b"], "steps": 120.0}])
    assert one.n == 60 and one.value == pytest.approx(_hand(20, 40)[0], rel=1e-12)
    assert one.se == pytest.approx(_hand(20, 40)[1], rel=1e-12)
    b0 = pooled_b_simple(runs, [{"trial_id": "a", "trial_ids": ["a", "b"], "steps": 120.0}], k=0, window=40)
    assert b0.n == 16 and b0.value == pytest.approx(_hand(8, 8)[0], rel=1e-12)
    assert b0.se == pytest.approx(_hand(8, 8)[1], rel=1e-12)
    none = pooled_b_simple(runs, [{"trial_id": "a", "steps": float("inf")}])
    assert not none.ok and none.n == 0
    after = pooled_b_simple(runs, [{"trial_id": "b", "steps": float("inf")}, {"trial_id": "a", "steps": 120.0}])
    alone = pooled_b_simple(runs, [{"trial_id": "a", "steps": 120.0}])
    assert after.n == alone.n == 20 and after.value == alone.value  # a point without a crossing is skipped, not the end
    unknown = pooled_b_simple(runs, [{"trial_id": "zz", "steps": 120.0}, {"trial_id": "a", "steps": 120.0}])
    assert unknown.n == 20 and unknown.value == alone.value  # a point whose trials the runs do not hold adds nothing
    early = pooled_b_simple(runs, [{"trial_id": "b", "steps": 0.5}, {"trial_id": "a", "steps": 120.0}])
    assert early.n == 20 and early.value == alone.value  # a window before the first measurement adds nothing
    assert pooled_b_simple(runs, [{"trial_id": "b", "steps": 0.5}]).n == 0


def _noisy_runs(rng, trials: int, per_trial: int, g2: float, trace: float, sd: float):
    """``trials`` trials, each with ``per_trial`` bin-0 measurements (steps 10, 20, ...) of |G|^2 = g2, tr = trace,
    every raw |G_b|^2 and |G_B|^2 with independent Gaussian noise of standard deviation ``sd``."""
    ids = [f"t{i}" for i in range(trials)]
    n = len(ids)
    trial_cols = {"trial_id": ids, "batch_size": [64] * n, "micro_batch_size": [16] * n, "grad_accum": [4] * n,
                  "num_workers": [1] * n, "lr": [1e-3] * n, "seed": list(range(n)), "gns_window": [1000] * n,
                  "status": [m.STATUS_BUDGET_SPENT] * n}  # fmt: skip
    cols: dict[str, list] = {k: [] for k in ("trial_id", "step", "examples", "metric", "value")}
    steps = 10 * np.arange(1, per_trial + 1)
    for tid in ids:
        small = g2 + trace / B_SMALL + sd * rng.standard_normal(steps.size)
        big = g2 + trace / B_BIG + sd * rng.standard_normal(steps.size)
        for name, v in zip(gns_names(0), [small, big, np.full(steps.size, B_SMALL), np.full(steps.size, B_BIG)],
                           strict=True):  # fmt: skip
            cols["trial_id"] += [tid] * steps.size
            cols["step"] += steps.tolist()
            cols["examples"] += (64 * steps).tolist()
            cols["metric"] += [name] * steps.size
            cols["value"] += np.asarray(v, dtype=float).tolist()
    return runs_from_tables(trials_table(trial_cols), metrics_table(cols), source="noisy"), ids, float(steps[-1])


def test_pooled_b_simple_is_the_float64_ratio_of_means_and_its_se_covers() -> None:
    """Against the brute force (the unbiased estimates of every measurement of every trial, by hand in float64, then
    b_simple_with_se: one point is one stratum), and against the known B_simple = tr / |G|^2 = 8: over 300 noisy
    sweeps of 15 trials x 3 measurements (each measurement's tr(Sigma) estimate ~60% noise) its ±1.645 SE interval
    covers 8 about 90% of the time."""
    rng = np.random.default_rng(7)
    runs, ids, end = _noisy_runs(rng, 15, 3, g2=0.5, trace=4.0, sd=0.08)
    est = pooled_b_simple(runs, [{"trial_id": ids[0], "trial_ids": ids, "steps": end}], k=0)
    g, t = [], []
    small, big = runs.series(gns_names(0)[0]), runs.series(gns_names(0)[1])
    for row in range(len(ids)):
        sm, bg = small.value[small.trial == row], big.value[big.trial == row]
        g += list((B_BIG * bg - B_SMALL * sm) / (B_BIG - B_SMALL))
        t += list(B_SMALL * B_BIG * (sm - bg) / (B_BIG - B_SMALL))
    want = gns.b_simple_with_se(np.array(g), np.array(t))
    assert est.ok and est.n == 45
    assert (est.value, est.se) == pytest.approx(want, rel=1e-12)
    hits, n = 0, 300
    for _ in range(n):
        runs, ids, end = _noisy_runs(rng, 15, 3, g2=0.5, trace=4.0, sd=0.08)
        points = [{"trial_id": ids[i], "trial_ids": ids[i : i + 3], "steps": end} for i in range(0, 15, 3)]
        e = pooled_b_simple(runs, points, k=0)  # 5 points of 3 seeds: the stratified form
        hits += e.ok and abs(e.value - 8.0) <= 1.645 * e.se
    assert 0.85 <= hits / n <= 0.95
