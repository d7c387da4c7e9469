"""analysis.features.branched.branched against synthetic branched studies with a known answer.

Every branch's loss after Δ examples is ``L1 · (1 + a·log2 k)`` (times seed noise), so the relative excess over the
``k = 1`` branch is ``a·log2 k`` and the critical multiplier at tolerance ε is exactly ``2**(ε/a)`` (linear in
``log k``: the interpolation is exact)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from analysis.core import metrics as m
from analysis.core.lr_rules import lr_factor
from analysis.features.branched import branched as br
from analysis.sources import schema as S
from analysis.sources.loaders import is_branched, runs_from_tables
from analysis.sources.schema import RunsTableError, metrics_table, trials_table

B0, DELTA, EVALS = 8, 1024, 8
KS = (1, 2, 4, 8, 16)
POINTS = (100, 200, 400)


def slope(point: int, bin_: int | None) -> float:
    """Excess per doubling of k: falls with training progress (the critical batch grows), differs per bin."""
    base = {100: 0.02, 200: 0.01, 400: 0.005}[point]
    return base if bin_ is None else base * (0.5, 4.0)[bin_]


def make_study(
    seeds=(0, 1, 2), noise=0.0, diverged=(), failed=(), absent=(), bump_window=0.0, rng_seed=0, point_slope=slope
):
    """A reference (steps 0..400 at B0) and branches (point, k, seed) with evaluations at the same examples.

    ``bump_window``: the evaluations before Δ are higher by this relative amount for k > 1 (tests the window)."""
    rng = np.random.default_rng(rng_seed)
    tr = {k: [] for k in ("trial_id", "batch_size", "micro_batch_size", "grad_accum", "num_workers", "lr", "seed")}
    tr.update({"status": [], "max_steps": [], S.PARENT: [], S.BRANCH_STEP: [], S.K: []})
    rows = {k: [] for k in ("trial_id", "step", "examples", "metric", "value")}

    def add_trial(tid, b, seed, status, max_steps, parent=None, point=None, k=None):
        for key, v in (("trial_id", tid), ("batch_size", b), ("micro_batch_size", b), ("grad_accum", 1)):
            tr[key].append(v)
        tr["num_workers"].append(1)
        tr["lr"].append(1e-3)
        tr["seed"].append(seed)
        tr["status"].append(status)
        tr["max_steps"].append(float(max_steps))
        tr[S.PARENT].append(parent)
        tr[S.BRANCH_STEP].append(point)
        tr[S.K].append(k)

    def add_row(tid, step, b, metric, value):
        rows["trial_id"].append(tid)
        rows["step"].append(step)
        rows["examples"].append(step * b)
        rows["metric"].append(metric)
        rows["value"].append(value)

    add_trial("ref", B0, 0, m.STATUS_BUDGET_SPENT, 400)
    for s in range(0, 401, 100):
        for name in (m.EVAL_LOSS, "eval/loss/bin0", "eval/loss/bin1"):
            add_row("ref", s, B0, name, 1.0 / (1 + s / 100))
    for p in POINTS:
        for k in KS:
            for seed in seeds:
                tid = f"p{p}-k{k}-s{seed}"
                if (p, k, seed) in absent:
                    continue
                b = k * B0
                n = DELTA // b
                status = m.STATUS_BUDGET_SPENT
                if (p, k, seed) in diverged:
                    status = m.STATUS_DIVERGED
                if (p, k, seed) in failed:
                    status = m.STATUS_FAILED
                add_trial(tid, b, seed, status, n, "ref", p, float(k))
                every = n // EVALS
                eps_seed = noise * rng.standard_normal()
                for j in range(EVALS + 1):
                    step = j * every
                    for name, bin_ in ((m.EVAL_LOSS, None), ("eval/loss/bin0", 0), ("eval/loss/bin1", 1)):
                        l1 = 0.5 / (1 + p / 100) * (1.0 if bin_ is None else (0.7, 1.3)[bin_])
                        v = l1 * (1 + point_slope(p, bin_) * math.log2(k)) * (1 + eps_seed)
                        if j < EVALS and k > 1:
                            v *= 1 + bump_window
                        add_row(tid, step, b, name, v)
    trials = trials_table(tr)
    return runs_from_tables(trials, metrics_table(rows))


def answer(result_points, p_index, eps_index=0):
    return result_points[p_index]["by_epsilon"][eps_index]


def test_known_answer_globally_and_per_bin():
    runs = make_study(seeds=(0,))
    assert is_branched(runs)
    out = br.analyze(runs, epsilons=[0.025], bootstrap=0)
    assert out["b0"] == B0 and out["delta_examples"] == DELTA and out["multipliers"] == list(map(float, KS))
    for i, p in enumerate(POINTS):
        a = answer(out["points"], i)
        k_true = 2 ** (0.025 / slope(p, None))
        if k_true <= 16:
            assert a["bound"] is None
            assert a["b_crit"] == pytest.approx(k_true * B0, rel=1e-9)
            assert a["b_crit_grid"] == 2 ** math.floor(math.log2(k_true)) * B0
        else:
            assert a["bound"] == "lower" and a["b_crit"] == 16 * B0
        assert out["points"][i]["examples"] == p * B0
    # bin 0: slope halved -> k doubles in log; bin 1: slope x4
    bins = {b["bin"]: b["points"] for b in out["bins"]}
    assert answer(bins[0], 0)["b_crit"] == pytest.approx(2 ** (0.025 / 0.01) * B0)
    assert answer(bins[1], 0)["b_crit"] == pytest.approx(2 ** (0.025 / 0.08) * B0)
    assert answer(bins[1], 2)["b_crit"] == pytest.approx(2 ** (0.025 / 0.02) * B0)


def test_epsilon_sensitivity_is_monotone_and_exact():
    out = br.analyze(make_study(seeds=(0,)), epsilons=[0.005, 0.01, 0.02], bootstrap=0)
    vals = [a["b_crit"] for a in out["points"][0]["by_epsilon"]]
    assert vals == pytest.approx([2 ** (e / 0.02) * B0 for e in (0.005, 0.01, 0.02)])
    assert vals[0] < vals[1] < vals[2]


def test_seed_noise_interval_covers_truth_and_seed_means_first():
    runs = make_study(seeds=tuple(range(6)), noise=0.002, rng_seed=3)
    out = br.analyze(runs, epsilons=[0.02], bootstrap=400)
    a = answer(out["points"], 1)
    truth = 2 ** (0.02 / 0.01) * B0
    lo, hi = a["b_crit_ci"]
    assert lo <= truth <= hi and lo < hi
    assert len(a["b_crit_per_seed"]) == 6
    assert a["b_crit"] == pytest.approx(truth, rel=0.25)


def test_diverged_branch_is_never_within_tolerance_and_failed_is_missing():
    div = {(100, 4, 0)}
    out = br.analyze(make_study(seeds=(0,), diverged=div), epsilons=[0.05], bootstrap=0)
    a = answer(out["points"], 0)
    assert a["b_crit"] == 2 * B0 and a["bound"] is None  # k=4 diverged: no interpolation towards it
    # k = 4 failed instead: missing, so the rule interpolates between 2 and 8
    out = br.analyze(make_study(seeds=(0,), failed=div), epsilons=[0.05], bootstrap=0)
    a = answer(out["points"], 0)
    assert a["b_crit"] == pytest.approx(2 ** (0.05 / 0.02) * B0)
    assert out["points"][0]["loss_after_delta"]["4"] is None


def test_upper_bound_when_no_multiplier_is_within_tolerance_and_best_compare():
    # every k > 1 is 2-5% worse, but compare='best' against a k=1 that is itself the best gives the same
    out = br.analyze(make_study(seeds=(0,)), epsilons=[0.0], compare="best", bootstrap=0)
    assert answer(out["points"], 0)["b_crit"] == B0 and answer(out["points"], 0)["bound"] is None
    # a study where larger k is *better*: 'best' compares with the largest k, 'reference' with k = 1
    runs = make_study(seeds=(0,), point_slope=lambda p, b: -0.01)
    ref = answer(br.analyze(runs, epsilons=[0.01], bootstrap=0)["points"], 0)
    assert ref["bound"] == "lower" and ref["b_crit"] == 16 * B0
    best = answer(br.analyze(runs, epsilons=[0.01], compare="best", bootstrap=0)["points"], 0)
    # excess vs k=16: 0.01*(4 - log2 k) <= 0.01 -> k >= 8; the largest within tolerance is 16 (lower bound)
    assert best["bound"] == "lower"
    assert br.crossing(np.array([1.0, 2.0]), np.array([0.05, 0.1]), 0.01).bound == "upper"


def test_window_averages_the_last_evaluations():
    runs = make_study(seeds=(0,), bump_window=0.04)
    last = answer(br.analyze(runs, epsilons=[0.03], window=0.0, bootstrap=0)["points"], 0)
    assert last["b_crit"] == pytest.approx(2**1.5 * B0)  # only the evaluation at Δ: the bump is invisible
    win = answer(br.analyze(runs, epsilons=[0.03], window=0.5, bootstrap=0)["points"], 0)
    assert win["b_crit"] < last["b_crit"]  # 4 of the 5 evaluations in the window are 4% higher for k > 1
    assert br.window_mean([0, 512, 768, 1024], [9, 1, 2, 3], 1024, 0.5) == pytest.approx(2.0)
    assert math.isnan(br.window_mean([0, 512], [1, 2], 1024, 0.2))  # no evaluation in the window


def test_cost_counts_reference_and_branches():
    out = br.analyze(make_study(seeds=(0, 1)), epsilons=[0.02], bootstrap=0)
    n_branches = len(POINTS) * len(KS) * 2
    assert out["cost"] == {
        "reference_examples": 400 * B0,
        "branch_examples": n_branches * DELTA,
        "total_examples": 400 * B0 + n_branches * DELTA,
    }


def test_bad_studies_are_refused():
    runs = make_study(seeds=(0,), absent={(p, 1, 0) for p in POINTS})
    with pytest.raises(RunsTableError, match="k = 1"):
        br.analyze(runs, epsilons=[0.02])
    plain = runs_from_tables(
        trials_table(
            {
                "trial_id": ["a"],
                "batch_size": [8],
                "micro_batch_size": [8],
                "grad_accum": [1],
                "num_workers": [1],
                "lr": [1e-3],
                "seed": [0],
                "status": [m.STATUS_BUDGET_SPENT],
            }
        ),
        metrics_table({k: [] for k in ("trial_id", "step", "examples", "metric", "value")}),
    )
    assert not is_branched(plain)
    with pytest.raises(RunsTableError, match="not a branched study"):
        br.study_of(plain)
    with pytest.raises(ValueError, match="window"):
        br.analyze(make_study(seeds=(0,)), window=1.0)


def test_lr_rules():
    assert lr_factor("sqrt", 4) == 2 and lr_factor("linear", 4) == 4 and lr_factor("constant", 4) == 1
    with pytest.raises(ValueError):
        lr_factor("cubic", 2)


def test_seeds_are_averaged_before_the_rule():
    """Seed 0 excess a·log2 k, seed 1 excess 3a·log2 k, same L1: the seed mean has 2a·log2 k (a minimum over seeds
    would give seed 0's answer)."""
    ks = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    a = 0.01
    loss = np.stack([1 + a * np.log2(ks), 1 + 3 * a * np.log2(ks)], axis=1)  # (K, S)
    r = br.critical_k(ks, loss, 0.03, bootstrap=100)
    assert r["k"] == pytest.approx(2 ** (0.03 / (2 * a)))
    assert r["k_per_seed"] == pytest.approx([2**3.0, 2**1.0])
    lo, hi = r["k_ci"]
    assert lo == pytest.approx(2.0) and hi == pytest.approx(8.0)  # resamples: both seeds 1, mixed, both seed 0


def test_the_references_live_b_simple_stands_beside_each_branch_point(tmp_path):
    """The reference's B_simple at each branch point, globally and per bin, re-smoothed over its own window: with
    |G|^2 = 1 and tr(Sigma) = S, E|G_b|^2 = 1 + S/b, so measurements at b = 4 and B = 8 give B_simple = S exactly;
    the figure draws the same traces."""
    from analysis.features.branched.branch_report import plot
    from analysis.fits.gns_view import gns_names

    runs = make_study(seeds=(0,))
    noise = {None: 10.0, 0: 4.0, 1: 20.0}
    rows = {k: [] for k in ("trial_id", "step", "examples", "metric", "value")}
    for k, s in noise.items():
        for step in range(1, 401):
            for name, v in zip(gns_names(k), (1 + s / 4, 1 + s / 8, 4.0, 8.0), strict=True):
                for key, x in zip(rows, ("ref", step, step * B0, name, v), strict=True):
                    rows[key].append(x)
    with_gns = runs_from_tables(runs.trials, pa.concat_tables([runs.metrics, metrics_table(rows)]))
    out = br.analyze(with_gns, epsilons=[0.025], bootstrap=0)
    assert [p["b_simple"] for p in out["points"]] == pytest.approx([10.0] * len(POINTS), rel=1e-12)
    for b in out["bins"]:
        assert [p["b_simple"] for p in b["points"]] == pytest.approx([noise[b["bin"]]] * len(POINTS), rel=1e-12)
    assert plot(out, with_gns, tmp_path / "branched.png").exists()
