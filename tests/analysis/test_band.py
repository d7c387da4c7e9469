"""analysis.fits.band (B_crit of a band between two targets) against closed forms on sweeps whose local critical batch
size grows along training, so the band's answer and the cumulative one (`analyze_metric`) differ by a known amount."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from analysis.core import metrics as m
from analysis.fits import pareto
from analysis.fits.band import band_b_crit
from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import runs_from_tables
from analysis.sources.schema import METRICS_SCHEMA, trials_table

L0, FLOOR = 1.0, 0.1
S_MIN, E_MIN, U_REF = 50.0, 50.0 * 64, 4.0
BATCH_SIZES = (4, 8, 16, 32, 64, 128, 256, 512)
HI, LO = 0.4, 0.25


def u(y):
    """Progress at loss y (the S_min part of the steps grows like u)."""
    return (L0 - FLOOR) / (np.asarray(y, dtype=np.float64) - FLOOR) - 1.0


def w(y):
    """The E_min part grows like u²: examples-hungry late training, a local B_crit that grows."""
    return u(y) ** 2 / U_REF


def cumulative_truth(y: float) -> float:
    return E_MIN * w(y) / (S_MIN * u(y))


def band_truth(hi: float, lo: float) -> float:
    return E_MIN * (w(lo) - w(hi)) / (S_MIN * (u(lo) - u(hi)))


def sweep(rng, seeds=1, sigma=0.0, n_evals=400, lr_factors=(0.5, 1.0, 2.0), stop_at=None, stop_factors=None):
    """Trials whose steps to reach loss y are ``(S_MIN·u(y) + E_MIN·w(y)/B)·penalty(lr)·noise`` exactly (the loss
    curve is that relation inverted on a fine grid, then read at the evaluation steps)."""
    grid = [(b, f, s) for b in BATCH_SIZES for f in lr_factors for s in range(seeds)]
    ys = np.linspace(L0 - 1e-9, 0.16, 4000)
    trials, cols = [], {k: [] for k in METRICS_SCHEMA.names}
    for i, (b, f, s) in enumerate(grid):
        scale = (1.0 + 0.3 * np.log2(f) ** 2) * rng.lognormal(0.0, sigma)
        steps_to = (S_MIN * u(ys) + E_MIN * w(ys) / b) * scale  # increasing as ys falls
        budget = (S_MIN * u(0.17) + E_MIN * w(0.17) / b) * 1.0
        ev = np.unique(np.round(np.linspace(0, budget, n_evals + 1)).astype(np.int64))
        loss = np.interp(ev, steps_to, ys)
        if stop_at is not None and (loss <= stop_at).any() and (stop_factors is None or f in stop_factors):
            ev, loss = ev[: int(np.argmax(loss <= stop_at)) + 1], loss[: int(np.argmax(loss <= stop_at)) + 1]
        tid = f"t{i:04d}"
        trials.append((tid, b, f, s))
        cols["trial_id"].append(np.full(len(ev), tid))
        cols["step"].append(ev)
        cols["examples"].append(ev * b)
        cols["metric"].append(np.full(len(ev), m.EVAL_LOSS))
        cols["value"].append(loss)
    t = trials_table(
        {
            "trial_id": [x[0] for x in trials],
            "batch_size": [x[1] for x in trials],
            "micro_batch_size": [x[1] for x in trials],
            "grad_accum": [1] * len(trials),
            "num_workers": [1] * len(trials),
            "lr": [1e-3 * x[2] for x in trials],
            "seed": [x[3] for x in trials],
            "status": [m.STATUS_BUDGET_SPENT] * len(trials),
        }
    )
    metrics = pa.table({k: np.concatenate(v) for k, v in cols.items()}, schema=METRICS_SCHEMA)
    return runs_from_tables(t, metrics, source="synthetic")


def test_closed_forms_differ():
    """The test's premise: along this sweep the band's B_crit is well above the cumulative one at its lower end."""
    assert band_truth(HI, LO) > 1.3 * cumulative_truth(LO)


def test_band_recovers_its_closed_form_and_differs_from_the_cumulative_answer():
    runs = sweep(np.random.default_rng(0))
    band = band_b_crit(runs, m.EVAL_LOSS, HI, LO, bootstrap=0)
    assert band["b_crit"] == pytest.approx(band_truth(HI, LO), rel=0.02)
    assert band["s_min"] == pytest.approx(S_MIN * (u(LO) - u(HI)), rel=0.02)
    assert band["e_min"] == pytest.approx(E_MIN * (w(LO) - w(HI)), rel=0.02)
    cum = analyze_metric(runs, m.EVAL_LOSS, [LO], bootstrap=0)[0]
    assert cum["b_crit"] == pytest.approx(cumulative_truth(LO), rel=0.02)
    assert [p["batch_size"] for p in band["points"]] == list(BATCH_SIZES) and band["flags"] == []


def test_band_interval_covers_the_truth_under_seed_noise_and_a_global_stop():
    """Three seeds, 10% multiplicative scatter, trials stopped at a global target just below the band."""
    truth, hits = band_truth(HI, LO), 0
    for d in range(12):
        runs = sweep(np.random.default_rng(100 + d), seeds=3, sigma=0.1, n_evals=200, stop_at=0.24)
        band = band_b_crit(runs, m.EVAL_LOSS, HI, LO, bootstrap=200, seed=d)
        lo, hi = band["b_crit_ci"]
        assert band["ci_resamples"] == "seeds" and lo < band["b_crit"] < hi
        hits += lo <= truth <= hi
    # nominal 90%, but the band's interval is not calibrated: over 36 draws (seeds 100-135) it held the truth 29 times
    # with the first-passage crossing and 28 with the local fit (analysis.fits.crossing), 8 of these first 12
    assert hits >= 8


def test_band_flags_censoring_and_refuses_bad_bands():
    runs = sweep(np.random.default_rng(1), stop_at=0.3)  # every trial stops above LO: nothing known there
    with pytest.raises(pareto.TooFewBatchSizesError, match="do not"):
        band_b_crit(runs, m.EVAL_LOSS, HI, LO, bootstrap=0)
    # only the best lr stopped above LO: the slower lrs reach LO, but the minimum there is unknown (censored)
    runs = sweep(np.random.default_rng(1), stop_at=0.3, stop_factors=(1.0,))
    with pytest.raises(pareto.TooFewBatchSizesError, match="censored"):
        band_b_crit(runs, m.EVAL_LOSS, HI, LO, bootstrap=0)
    with pytest.raises(ValueError, match="hi > lo"):
        band_b_crit(runs, m.EVAL_LOSS, LO, HI)


def test_analyze_reports_the_bands_between_consecutive_targets(tmp_path):
    from analysis.reporting.report import analyze

    runs = sweep(np.random.default_rng(0))
    res = analyze(runs, m.EVAL_LOSS, [0.25, 0.55, 0.4], tmp_path, bootstrap=50, plots=False)
    assert [(b["hi"], b["lo"]) for b in res["bands"]] == [(0.55, 0.4), (0.4, 0.25)]
    for b in res["bands"]:
        assert b["b_crit"] == pytest.approx(band_truth(b["hi"], b["lo"]), rel=0.02)
    assert res["bands"][1]["b_crit"] > 1.3 * res["bands"][0]["b_crit"]  # it grows along training
    md = (tmp_path / "report.md").read_text()
    assert "| 0.4 → 0.25 |" in md and "B_crit along training" in md
    from analysis.reporting.report import summary_lines

    line = [x for x in summary_lines(res) if x.startswith("along training")]
    star = ["*" if b["flags"] else "" for b in res["bands"]]
    assert line[0].startswith(
        f"along training (B_crit of each band between targets): 0.55->0.4 {res['bands'][0]['b_crit']:.3g}{star[0]}, "
        f"0.4->0.25 {res['bands'][1]['b_crit']:.3g}{star[1]}"
    )


def test_a_band_carries_the_flags_of_the_targets_it_joins():
    from analysis.fits.band import bands_between

    runs = sweep(np.random.default_rng(0))
    entries = [{"target": 0.55, "flags": ["near_floor"]}, {"target": 0.4, "flags": []}, {"target": 0.25}]
    bands = bands_between(runs, m.EVAL_LOSS, entries, bootstrap=0)
    assert [b["flags"] for b in bands] == [["near_floor"], []]
    notes: list[str] = []
    assert bands_between(runs, m.EVAL_LOSS, [{"target": 0.25}, {"target": 0.12}], bootstrap=0, notes=notes) == []
    assert len(notes) == 1 and notes[0].startswith("band 0.25 -> 0.12: ")
