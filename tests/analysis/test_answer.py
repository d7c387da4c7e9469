"""The answer (analysis.fits.answer): per-bin B_crit at one common point of training, against known answers."""

import copy

import numpy as np
import pytest

from analysis.core import metrics as m
from analysis.fits import answer
from analysis.fits.steps import steps_to_target
from analysis.reporting.report import analyze, answer_lines
from tests.oracles.synth_runs import FLOOR, L0, synth_runs

S_MIN, E_MIN = 200.0, 200.0 * 256
BIN_E_MIN = (200.0 * 64, 200.0 * 256, 200.0 * 1024)  # true per-bin B_crit 64, 256, 1024


def _runs(seed=0, sigma=0.03):
    return synth_runs(np.random.default_rng(seed), seeds=3, sigma=sigma, bins=3, bin_e_min=BIN_E_MIN, n_evals=120)


def test_matched_bin_target_is_the_bin_loss_where_the_global_loss_crosses():
    runs = _runs()
    y = 0.3
    steps = steps_to_target(runs.series(m.EVAL_LOSS), len(runs.trial_ids), [y])[0]
    rows = [int(i) for i in np.flatnonzero(np.isfinite(steps))][:6]
    target = {"target": y, "points": [{"trial_id": runs.trial_ids[r]} for r in rows]}
    got = answer.matched_bin_target(runs, m.EVAL_LOSS, target, 1)
    s = runs.series(m.per_bin(m.EVAL_LOSS_BIN, 1))
    want = []
    for r in rows:
        lo, hi = np.searchsorted(s.trial, [r, r + 1])
        want.append(np.interp(steps[r], s.step[lo:hi], s.value[lo:hi]))
    assert got == pytest.approx(float(np.median(want)), rel=1e-3)
    # bin 1 has the global curve's shape on a 2x loss scale (synth_runs: 1 + 0.5 x its metric index) and the same
    # tau (bin_e_min[1] = E_MIN, same lr optimum): where the global loss is y, its loss is 2 y
    assert got == pytest.approx(2 * y, rel=1e-3)


@pytest.fixture(scope="module")
def analyzed() -> dict:
    """The known-answer sweep analysed once (the slow part of the two tests below)."""
    return analyze(_runs(), targets=[0.3, 0.25], bootstrap=200, seed=1, plots=False)


def test_per_bin_answer_recovers_known_bcrit_and_says_they_differ(analyzed):
    ans = analyzed["answer"]
    assert ans["at_target"] in (0.3, 0.25)
    truth = [e / S_MIN for e in BIN_E_MIN]
    assert [b["bin"] for b in ans["bins"]] == [0, 1, 2]
    for b, want in zip(ans["bins"], truth, strict=True):
        assert b["entry"] is not None
        assert b["entry"]["b_crit"] == pytest.approx(want, rel=0.15), b
    assert ans["sentence"].startswith("Yes: B_crit differs across timesteps beyond the 90% intervals")
    assert "t=666-999" in ans["sentence"]  # the largest B_crit is the last bin's


def _bin(k, bc, lo, hi, flags=()):
    ts = [(0, 332), (333, 665), (666, 999)][k]
    return {"bin": k, "timesteps": list(ts), "entry": {"b_crit": bc, "b_crit_ci": [lo, hi], "flags": list(flags)}}


def test_sentence_overlap_and_too_few():
    overlap = [_bin(0, 10, 8, 13), _bin(1, 12, 9, 15), _bin(2, 11, 9, 14)]
    assert answer.bins_sentence(overlap).startswith("Not beyond the 90% intervals: the trustworthy bins' B_crit range")
    apart = [_bin(0, 10, 8, 12), _bin(1, 30, 25, 36)]
    assert "3x larger at t=333-665 (30) than at t=0-332 (10)" in answer.bins_sentence(apart)
    flagged = [_bin(0, 10, 8, 12), _bin(1, 30, 25, 36, flags=["near_floor"])]
    assert answer.bins_sentence(flagged).startswith("Too few timestep bins have a trustworthy B_crit (1 of 2)")
    # a trustworthy bin without a finite interval cannot be compared
    assert answer.trusted_bins([_bin(0, 10, None, 12)]) == []


def test_answer_lines_quote_trusted_targets_and_bins(analyzed):
    res = copy.deepcopy(analyzed)  # its flags are changed below
    lines = answer_lines(res)
    assert lines[0].startswith("answer: B_crit = ")
    assert "90% intervals over seeds" in lines[0]
    assert lines[1].startswith(f"per timestep bin, where {m.EVAL_LOSS} reaches {res['answer']['at_target']:.4g}: ")
    assert lines[2] == res["answer"]["sentence"]
    for t in res["targets"]:
        t["flags"] = ["near_floor"]
    assert answer_lines(res) == []


def test_synthetic_constants_unchanged():
    assert (L0, FLOOR) == (1.0, 0.1)  # the closed forms above assume them
