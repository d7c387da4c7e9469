"""B_simple beside B_crit: re-smoothing with analysis.gns, reading it off at the crossing step."""

from __future__ import annotations

import numpy as np
import pytest
from synth_runs import synth_runs

from analysis import gns
from analysis import metrics as m
from analysis.gns_view import GNSTrace, attach_b_simple, b_simple_at, b_simple_trace, bins_in, gns_names


@pytest.fixture(scope="module")
def runs():
    return synth_runs(np.random.default_rng(2), seeds=1, bins=2, gns=True, lr_factors=(1.0,))


def test_names_and_bins(runs):
    assert gns_names() == (m.GNS_G2_SMALL, m.GNS_G2_BIG, m.GNS_B_SMALL, m.GNS_B_BIG)
    assert gns_names(1)[0] == "gns/bin1/g2_small"
    assert bins_in(runs, "gns/") == [0, 1]
    assert bins_in(runs, m.EVAL_LOSS + "/") == [0, 1]


def test_trace_is_the_gns_estimator_with_per_step_beta(runs):
    row = 3
    tr = b_simple_trace(runs, row, None, beta=0.99)
    s = [runs.series(n) for n in gns_names()]
    sel = s[0].trial == row
    gap = np.median(np.diff(s[0].step[sel]))
    ref = gns.ema_b_simple(*(x.value[x.trial == row] for x in s), beta=0.99**gap)
    np.testing.assert_allclose(tr.b_simple, ref, rtol=1e-12)
    np.testing.assert_array_equal(tr.step, s[0].step[sel])
    assert b_simple_trace(runs, row, 7) is None  # no such bin


def test_b_simple_at_interpolates_and_clamps():
    tr = GNSTrace(np.array([0, 10, 20]), np.array([1.0, 3.0, np.nan]))
    assert b_simple_at(tr, 5) == pytest.approx(2.0)
    assert b_simple_at(tr, 50) == pytest.approx(3.0)
    assert np.isnan(b_simple_at(None, 5)) and np.isnan(b_simple_at(tr, np.inf))


def test_attach_b_simple_recovers_the_synthetic_noise_scale(runs):
    # synthetic |G|^2 = 10 (L - 0.1), tr(Sigma) = 100, so B_simple = 10 / (L - 0.1) at loss L
    row = len(runs.trial_ids) - 1
    ev = runs.series(m.EVAL_LOSS)
    sel = ev.trial == row
    step = float(np.interp(0.3, ev.value[sel][::-1], ev.step[sel][::-1]))  # the loss falls: reverse for interp
    targets = [{"points": [{"trial_id": runs.trial_ids[row], "steps": step, "batch_size": 1}]}]
    attach_b_simple(runs, targets, None, beta=0.0)  # no smoothing: the raw two-batch estimate
    assert targets[0]["b_simple"] == pytest.approx(10 / (0.3 - 0.1), rel=0.3)
    assert targets[0]["points"][0]["b_simple"] == targets[0]["b_simple"]
