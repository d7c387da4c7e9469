"""``bcrit analyze`` pools the splits of one (batch size, setting, seed) into one repeat
(analysis.fits.steps.pool_splits).

Splits of one batch size run with one seed take the same steps up to numerics (same examples, same draws), so
they are one measurement, not several. On tests/oracles/synth_splits.py every split of a (B, lr, seed) follows the
same curve: the answer of a sweep with split variants must then be the answer of the same sweep without them,
point estimate and interval alike, also when a variant ran only some of the seeds (the demo's variants run one).
Left as separate settings (the code before pooling), the variants added settings whose seeds the bootstrap
resampled independently and minimised over: a different, narrower interval.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from analysis.fits.band import band_b_crit
from analysis.fits.steps import pool_splits, steps_to_target, trial_extent, usable
from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import Runs
from tests.oracles.synth_splits import synth_split_runs

Y = (0.35, 0.3)
PLAIN = ((16, 1, 1), (32, 1, 1), (64, 1, 1), (128, 1, 1), (256, 1, 1))
VARIANTS = ((8, 2, 1), (16, 1, 2), (32, 2, 1), (32, 1, 2), (64, 2, 1))  # B = 16, 32, 64, 64, 128


def _keep(runs: Runs, mask: np.ndarray) -> Runs:
    ids = [t for t, k in zip(runs.trial_ids, mask, strict=True) if k]
    metrics = runs.metrics.filter(
        pc.is_in(runs.metrics.column("trial_id"), value_set=runs.trials.column("trial_id").filter(mask))
    )
    out = Runs(runs.trials.filter(mask), metrics, source=runs.source)
    assert list(out.trial_ids) == ids
    return out


def _sweeps(seed: int):
    """(with variants at every seed, with variants at seed 0 only, without variants): the same curves."""
    rng = np.random.default_rng(seed)
    full = synth_split_runs(rng, splits=PLAIN + VARIANTS, seeds=3, sigma=0.1, sys_metrics=False)
    t = full.trials
    plain = pc.and_(pc.equal(t.column("grad_accum"), 1), pc.equal(t.column("num_workers"), 1)).to_numpy(
        zero_copy_only=False
    )
    seed0 = pc.equal(t.column("seed"), 0).to_numpy(zero_copy_only=False)
    return full, _keep(full, plain | seed0), _keep(full, plain)


def _answer(entries):
    return [x for e in entries for x in (e["target"], e["b_crit"], e["s_min"], e["e_min"], *e["b_crit_ci"])]


@pytest.mark.parametrize("seed", [0, 1])
def test_split_variants_leave_the_answer_and_its_interval_unchanged(seed):
    full, one_seed, plain = _sweeps(seed)
    want = _answer(analyze_metric(plain, "eval/loss", list(Y), bootstrap=300, seed=5))
    entry = analyze_metric(plain, "eval/loss", list(Y), bootstrap=0)[0]
    assert entry["ci_resamples"] == "seeds" and len(want) == 12 and None not in want
    assert _answer(analyze_metric(full, "eval/loss", list(Y), bootstrap=300, seed=5)) == pytest.approx(want)
    assert _answer(analyze_metric(one_seed, "eval/loss", list(Y), bootstrap=300, seed=5)) == pytest.approx(want)


def test_band_pools_the_splits_too():
    full, _one_seed, plain = _sweeps(2)
    want = band_b_crit(plain, "eval/loss", *Y, bootstrap=200, seed=3)
    got = band_b_crit(full, "eval/loss", *Y, bootstrap=200, seed=3)
    assert [got["b_crit"], *got["b_crit_ci"]] == pytest.approx([want["b_crit"], *want["b_crit_ci"]])


def test_pooled_steps_are_the_geometric_mean_and_censoring_survives():
    """Closed form on a hand-made group: two splits of one (B, lr, seed) at two targets."""
    full, _one, _plain = _sweeps(3)
    series = full.series("eval/loss")
    n = len(full.trial_ids)
    steps = steps_to_target(series, n, list(Y))
    last, _ = trial_extent(series, n)
    ok = usable(full)
    t = full.trials
    group = np.flatnonzero(
        (full.batch_size == 64)
        & (t.column("seed").to_numpy() == 1)
        & (t.column("lr").to_numpy() == t.column("lr").to_numpy()[(full.batch_size == 64)].min())
    )
    assert len(group) == 3  # 64x1x1, 32x2x1, 32x1x2
    _, before, _, ok_before = pool_splits(full, steps, last, ok)  # the other groups, before the hand edit
    steps[0, group] = [10.0, 40.0, 25.0]  # all reached the first target
    steps[1, group] = [30.0, np.inf, 50.0]  # one split never reached the second
    last[group] = [90.0, 60.0, 80.0]
    pooled, s2, l2, ok2 = pool_splits(full, steps, last, ok)
    k = group[0]
    assert s2[0, k] == pytest.approx((10.0 * 40.0 * 25.0) ** (1 / 3), rel=1e-12)
    assert s2[1, k] == np.inf  # censored unless every split reached
    assert l2[k] == pytest.approx((30.0 * 60.0 * 50.0) ** (1 / 3), rel=1e-12)  # its lower bound at that target
    assert not ok2[group[1:]].any() and ok2[k] and np.isnan(s2[:, group[1:]]).all()
    assert (pooled.trials.column("grad_accum").to_numpy() == 1).all()
    assert (pooled.trials.column("micro_batch_size").to_numpy() == pooled.batch_size).all()
    untouched = np.setdiff1d(np.arange(n), group)
    # the edit of one group leaves every other pooled column as it was: the same function on the same inputs (exact)
    assert np.array_equal(ok2[untouched], ok_before[untouched])
    assert np.array_equal(s2[:, untouched][:, ok2[untouched]], before[:, untouched][:, ok2[untouched]])
