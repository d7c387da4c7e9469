"""Held-out evaluation (`trainables.evaluation.HeldOutEval`): per-bin losses are per bin, the draws are common
random numbers (the same for every trial, rank split and global RNG state), and the bin counts are as documented."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.core.bins import bin_of, timestep_bins
from trainables.data import load_dataset
from trainables.diffusion import NUM_TIMESTEPS, make_scheduler, per_example_loss
from trainables.evaluation import EVAL_SEED, HeldOutEval
from trainables.presets import build_dit
from trainables.randomness import STREAM_EVAL, mix

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data():
    return load_dataset("digits", 297)


def _model(seed: int = 0):
    torch.manual_seed(seed)
    return build_dit("tiny", sample_size=8, in_channels=1, num_classes=10)


@settings(max_examples=15, deadline=None)
@given(num_bins=st.integers(1, 40), repeats=st.integers(1, 3))
def test_every_eval_timestep_lies_in_its_bin(data, num_bins: int, repeats: int) -> None:
    ev = HeldOutEval(data, repeats, num_bins, 0, 1, CPU)
    t, assigned = ev.t.numpy(), ev.bin_of.numpy()
    assert len(t) == 297 * repeats
    np.testing.assert_array_equal(bin_of(t, num_bins, NUM_TIMESTEPS), assigned)  # the bin it is counted in
    counts = np.bincount(assigned, minlength=num_bins)
    # stratified: floor or ceil of (eval_size x repeats) / K per bin, the first (n x R) mod K bins one more
    n, K = 297 * repeats, num_bins
    np.testing.assert_array_equal(counts, [n // K + (k < n % K) for k in range(K)])


def test_eval_timesteps_spread_over_each_bin(data) -> None:
    """Uniform inside the bin, not one fixed point of it: each bin's 59-60 draws cover most of its 100 values' range."""
    ev = HeldOutEval(data, 2, 10, 0, 1, CPU)
    for k, (lo, hi) in enumerate(timestep_bins(10, NUM_TIMESTEPS)):
        t = ev.t[ev.bin_of == k].numpy()
        assert t.min() < lo + 15 and t.max() > hi - 15, (k, t.min(), t.max())
        assert len(np.unique(t)) > 30


def test_per_bin_loss_is_the_mean_over_examples_whose_timestep_is_in_the_bin(data) -> None:
    """Brute force: every held-out example's loss from the same fixed draws, grouped by the bin of its timestep."""
    ev = HeldOutEval(data, 2, 10, 0, 1, CPU)
    model, sched = _model(), make_scheduler()
    loss, per_bin = ev(model, sched, contextlib.nullcontext)
    with torch.no_grad():
        model.eval()
        each = per_example_loss(model, sched, ev.x, ev.y, ev.t, ev.noise).double().numpy()
    k_of = bin_of(ev.t.numpy(), 10, NUM_TIMESTEPS)
    ref = [each[k_of == k].mean() for k in range(10)]
    np.testing.assert_allclose(per_bin, ref, rtol=1e-6)
    assert loss == pytest.approx(each.mean(), rel=1e-6)  # eval/loss: the mean over all positions


def test_common_random_numbers_across_trials_and_rank_splits(data) -> None:
    """The same examples, timesteps and noise whatever the global RNG state (each trial seeds its own), and however
    the positions are split over ranks: rank r of W holds positions r, r+W, ... with the single-rank draws."""
    torch.manual_seed(1)
    one = HeldOutEval(data, 2, 10, 0, 1, CPU)
    torch.manual_seed(2)
    np.random.seed(3)  # noqa: NPY002 (the global RNG a trial might have touched)
    again = HeldOutEval(data, 2, 10, 0, 1, CPU)
    for name in ("x", "y", "t", "noise", "bin_of"):
        assert torch.equal(getattr(one, name), getattr(again, name)), name
    W = 3
    shards = [HeldOutEval(data, 2, 10, r, W, CPU) for r in range(W)]
    for r, s in enumerate(shards):
        for name in ("x", "y", "t", "noise", "bin_of"):
            assert torch.equal(getattr(s, name), getattr(one, name)[r::W]), (r, name)
    # the examples are the held-out split: every held-out example once per repeat
    assert torch.equal(one.x[:297], data.get(np.arange(297), split="eval")[0])
    assert torch.equal(one.x[297:], one.x[:297])
    assert not torch.equal(one.noise[297:], one.noise[:297])  # a repeat draws new noise and timesteps


def test_eval_is_deterministic_and_leaves_training_mode(data) -> None:
    ev = HeldOutEval(data, 1, 10, 0, 1, CPU)
    model, sched = _model(), make_scheduler()
    model.train()
    a = ev(model, sched, contextlib.nullcontext)
    assert model.training  # restored after evaluating
    assert ev(model, sched, contextlib.nullcontext) == a
    model.eval()
    assert ev(model, sched, contextlib.nullcontext) == a
    assert not model.training
    b = ev(_model(seed=1), sched, contextlib.nullcontext)
    assert b != a


def test_draws_follow_the_documented_recipe(data) -> None:
    """Position p: a generator seeded with mix(EVAL_SEED, STREAM_EVAL, p) draws t uniform in bin p mod K (inclusive
    bounds), then standard normal noise: pinned, so every sweep ever run evaluates on the same draws."""
    ev = HeldOutEval(data, 2, 10, 0, 1, CPU)
    bins = timestep_bins(10, NUM_TIMESTEPS)
    hits_top = 0
    for p in [0, 1, 9, 10, 296, 297, 593]:
        g = torch.Generator().manual_seed(mix(EVAL_SEED, STREAM_EVAL, p))
        lo, hi = bins[p % 10]
        assert int(ev.t[p]) == int(torch.randint(lo, hi + 1, (1,), generator=g))
        assert torch.equal(ev.noise[p], torch.randn(ev.x.shape[1:], generator=g))
    for k, (_, hi) in enumerate(bins):
        hits_top += int((ev.t[ev.bin_of == k] == hi).any())
    assert hits_top >= 1  # the inclusive top of a bin is drawn (59-60 draws from 100 values per bin)


def test_a_rank_without_positions_has_empty_draws(data) -> None:
    """More ranks than held-out positions (tiny eval sets): the extra ranks hold nothing, and say so in shapes."""
    ev = HeldOutEval(data, 1, 10, 300, 400, CPU)  # positions 300.. of 297: none
    assert ev.t.shape == (0,) and ev.t.dtype == torch.int64
    assert ev.noise.shape == (0, *ev.x.shape[1:]) and len(ev.bin_of) == 0
