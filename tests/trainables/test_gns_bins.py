"""Per-bin GNS (``trainables.gns_bins``) against float64 ground truth (McCandlish et al. 2018, App. A.1).

Ground truth: a toy epsilon-model ``pred = c[y] + v * x_t`` (parameters ``c`` per class incl. the null class,
``v`` per pixel) on a 24-example dataset. Its per-example gradient is a polynomial of degree <= 2 in the
Gaussian noise, so the bin-restricted population mean ``G_k`` and ``E|g|^2`` are exact finite sums over
(example, timestep in bin k, label dropped or not) of closed-form Gaussian moments; ``tr(Sigma_k) = E|g|^2 - |G_k|^2``.
The mean of many seeded ``BinGNS`` measurements must match them within 2%, with a Monte-Carlo standard error
small enough that the check is several sigma.
"""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from analysis.core import metrics as M
from analysis.core.gns import from_subbatch_grads
from trainables.config import TrialConfig
from trainables.diffusion import make_scheduler, per_example_loss
from trainables.gns_bins import BinGNS, draw_examples, measurement_key, sub_batch_sq_norms

CLASSES, PIXELS, EXAMPLES = 12, 64, 24
CPU = torch.device("cpu")


class FakeData:
    """24 1x8x8 'images' with labels; the same ``get``/``info`` interface as ``trainables.data.Dataset``."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(5)
        self.x = torch.randn(EXAMPLES, 1, 8, 8, generator=gen)  # (24, 1, 8, 8) float32
        self.y = torch.arange(EXAMPLES) % CLASSES
        self.info = SimpleNamespace(train_size=EXAMPLES, num_classes=CLASSES)

    def get(self, indices, split: str = "train"):
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        return self.x[idx], self.y[idx]


class Toy(nn.Module):
    """``pred = c[y] + v * x_t`` in float64: gradients are exact polynomials of the noise."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(7)
        self.c = nn.Parameter(torch.randn(CLASSES + 1, PIXELS, generator=gen, dtype=torch.float64))
        self.v = nn.Parameter(0.1 + 0.1 * torch.rand(PIXELS, generator=gen, dtype=torch.float64))

    def forward(self, xt, timestep, class_labels):
        flat = xt.flatten(1).double()  # (n, D)
        pred = self.c[class_labels] + self.v * flat  # (n, D)
        return SimpleNamespace(sample=pred.reshape(xt.shape))


def exact_bin_truth(model: Toy, data: FakeData, scheduler, lo: int, hi: int, p_drop: float) -> tuple[float, float]:
    """Exact ``(|G_k|^2, tr Sigma_k)`` over the population restricted to timesteps ``lo..hi``."""
    c = model.c.detach().numpy()  # (C+1, D)
    v = model.v.detach().numpy()  # (D,)
    x0 = data.x.flatten(1).double().numpy()  # (N, D)
    ac = scheduler.alphas_cumprod.float()[lo : hi + 1]  # the float32 values add_noise uses
    a = ac.sqrt().double().numpy()[:, None, None]  # (T, 1, 1)
    s = (1 - ac).sqrt().double().numpy()[:, None, None]
    D = PIXELS
    G = np.zeros((CLASSES + 1, D)), np.zeros(D)  # E g over the population: (c part, v part)
    e_sq = 0.0  # E |g|^2
    for dropped, w_drop in ((True, p_drop), (False, 1.0 - p_drop)):
        labels = np.full(EXAMPLES, CLASSES) if dropped else data.y.numpy()
        alpha = c[labels][None] + v * a * x0[None]  # (T, N, D): r = alpha + beta * eps
        beta = v * s - 1.0  # (T, 1, D)
        beta = np.broadcast_to(beta, alpha.shape)
        pa = a * x0[None]  # x_t = pa + s * eps
        s_b = np.broadcast_to(s, alpha.shape)
        w = w_drop / (alpha.shape[0] * EXAMPLES)  # weight of one (t, example) member
        k = 2.0 / D
        g_c = k * alpha  # E over eps of dL/dc[label]
        g_v = k * (alpha * pa + beta * s_b)  # E over eps of dL/dv
        np.add.at(G[0], labels, w * g_c.sum(axis=0))
        G[1][:] += w * g_v.sum(axis=(0, 1))
        a0, a1, a2 = alpha * pa, alpha * s_b + beta * pa, beta * s_b  # r * x_t = a0 + a1 eps + a2 eps^2
        e_sq += w * (k * k * (alpha**2 + beta**2)).sum()
        e_sq += w * (k * k * (a0**2 + a1**2 + 3 * a2**2 + 2 * a0 * a2)).sum()
    g2 = float((G[0] ** 2).sum() + (G[1] ** 2).sum())
    return g2, e_sq - g2


def _bin_gns(n: int, bins: int = 4, rank: int = 0, world: int = 1, **kw) -> BinGNS:
    cfg = TrialConfig(**{"timestep_bins": bins, "gns_every": 1, "gns_bin_examples": n, "class_dropout": 0.3, **kw})
    return BinGNS(cfg, Toy(), FakeData(), make_scheduler(), rank, world, CPU, contextlib.nullcontext)


def test_per_bin_estimates_unbiased_against_exact_population() -> None:
    n, reps = 32, 1500  # Monte-Carlo SE ~0.5% of the truth: the 2% check is ~4 sigma
    gns = _bin_gns(n, bins=2)
    rows = np.stack([gns.local_stats(step).numpy() for step in range(reps)])  # (R, K, 4)
    small, big, b, B = rows[..., 0], rows[..., 1], rows[..., 2], rows[..., 3]
    assert np.all(b == n // 2) and np.all(B == n)
    g2_draws = (B * big - b * small) / (B - b)
    trace_draws = (small - big) / (1 / b - 1 / B)
    truths = []
    for k, (lo, hi) in enumerate(gns.bins):
        g2_true, tr_true = exact_bin_truth(gns.model, gns.data, gns.scheduler, lo, hi, 0.3)
        truths.append((g2_true, tr_true))
        for est, true in ((g2_draws[:, k], g2_true), (trace_draws[:, k], tr_true)):
            mean, se = est.mean(), est.std(ddof=1) / np.sqrt(reps)
            assert se < 0.006 * abs(true), f"bin {k}: Monte-Carlo SE {se:.3g} too large for a 2% check"
            assert mean == pytest.approx(true, rel=0.02), f"bin {k}: mean {mean:.5g} vs exact {true:.5g}"
        # the raw statistics have the expectations the estimators rely on: E|G_b|^2 = |G|^2 + tr/b
        assert small[:, k].mean() == pytest.approx(g2_true + tr_true / (n // 2), rel=0.02)
        assert big[:, k].mean() == pytest.approx(g2_true + tr_true / n, rel=0.02)
    # the bins really differ: restricting the timesteps matters (the test would catch an unrestricted draw)
    b_simple = [tr / g2 for g2, tr in truths]
    assert max(b_simple) > 1.5 * min(b_simple)


def test_sub_batch_norms_equal_from_subbatch_grads() -> None:
    """The streaming group statistics equal ``analysis.core.gns.from_subbatch_grads`` on explicit group gradients."""
    model, data, sched = Toy(), FakeData(), make_scheduler()
    params = list(model.parameters())
    batch = draw_examples(data, 123, 12, 0, 999, 0.3)
    small, big = sub_batch_sq_norms(model, params, sched, batch, 4, CPU)
    rows = []
    for i in range(3):
        sl = slice(4 * i, 4 * i + 4)
        loss = per_example_loss(model, sched, *(t[sl] for t in batch)).mean()
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]).numpy())
    ref_small, ref_big, b, B = from_subbatch_grads(np.stack(rows), [4, 4, 4])
    assert (b, B) == (4, 12)
    assert small == pytest.approx(ref_small, rel=1e-12) and big == pytest.approx(ref_big, rel=1e-12)


def test_draws_restricted_to_bin_and_seeded() -> None:
    data = FakeData()
    x, y, t, noise = draw_examples(data, 42, 400, 250, 499, 0.3)
    assert int(t.min()) >= 250 and int(t.max()) <= 499 and len(set(t.tolist())) > 150
    dropped = float((y == CLASSES).float().mean())
    assert 0.2 < dropped < 0.4  # label drop at class_dropout=0.3
    again = draw_examples(data, 42, 400, 250, 499, 0.3)
    assert all(torch.equal(a, b) for a, b in zip((x, y, t, noise), again, strict=True))
    other = draw_examples(data, 43, 400, 250, 499, 0.3)
    assert not torch.equal(t, other[2])


def test_round_robin_over_ranks_equals_one_rank() -> None:
    one = _bin_gns(8, bins=5).local_stats(11)
    parts = [_bin_gns(8, bins=5, rank=r, world=3).local_stats(11) for r in range(3)]
    for r, part in enumerate(parts):
        owned = part[:, 3] > 0
        assert owned.tolist() == [k % 3 == r for k in range(5)]
    assert torch.equal(sum(parts), one)  # zeros elsewhere: the all_reduce sum is exactly the W=1 table


def test_measure_names_leaves_grads_and_global_rng_alone() -> None:
    gns = _bin_gns(8, bins=3)
    before = torch.get_rng_state()
    first = gns.measure(1)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(p.grad is None for p in gns.model.parameters())
    raw = [M.GNS_BIN_G2_SMALL, M.GNS_BIN_G2_BIG, M.GNS_BIN_B_SMALL, M.GNS_BIN_B_BIG, M.GNS_BIN_G2, M.GNS_BIN_TRACE]
    assert set(first) == {M.per_bin(t, k) for t in raw for k in range(3)}  # one measurement: no B_simple yet
    second = gns.measure(2)
    smoothed = [M.GNS_BIN_B_SIMPLE, M.GNS_BIN_B_SIMPLE_SE]
    assert set(second) == {M.per_bin(t, k) for t in raw + smoothed for k in range(3)}
    g2 = [first[M.per_bin(M.GNS_BIN_G2, 0)], second[M.per_bin(M.GNS_BIN_G2, 0)]]
    tr = [first[M.per_bin(M.GNS_BIN_TRACE, 0)], second[M.per_bin(M.GNS_BIN_TRACE, 0)]]
    assert second[M.per_bin(M.GNS_BIN_B_SIMPLE, 0)] == pytest.approx(np.mean(tr) / np.mean(g2), rel=1e-12)


def test_per_bin_window_is_in_steps_not_measurements() -> None:
    """Measured every 10 steps with a 25-step window, a bin holds the measurements of the last 25 steps: 3 of them
    (a per-measurement window would hold 25)."""
    gns = _bin_gns(8, bins=2, gns_every=10, gns_window=25, max_steps=100)
    counts = []
    for step in range(10, 101, 10):
        gns.measure(step)
        counts.append(gns.windows[0].estimate.n)
    assert counts == [1, 2, 3, 3, 3, 3, 3, 3, 3, 3]  # (s - 25, s] holds s - 20, s - 10, s


def test_state_dict_round_trip() -> None:
    a = _bin_gns(8, bins=3, gns_window=3)
    for step in (1, 2, 3):
        a.measure(step)
    b = _bin_gns(8, bins=3, gns_window=3)
    b.load_state_dict(a.state_dict())
    assert a.measure(4) == b.measure(4)
    c = _bin_gns(8, bins=3, gns_window=3)  # without the restored state: one measurement, no value yet
    assert M.per_bin(M.GNS_BIN_B_SIMPLE, 0) not in c.measure(5)
    assert M.per_bin(M.GNS_BIN_B_SIMPLE, 0) in b.measure(5)
    with pytest.raises(ValueError, match="^per-bin GNS state has 3 bins, this trial 4$"):
        _bin_gns(8, bins=4).load_state_dict(a.state_dict())
    d = _bin_gns(8, bins=3, gns_window=3)
    d.load_state_dict(None)  # a checkpoint written with per-bin GNS off: empty windows
    assert d.state_dict() == _bin_gns(8, bins=3, gns_window=3).state_dict()
    e = _bin_gns(8, bins=3, gns_window=3)  # a checkpoint from before the window rule: empty windows
    e.load_state_dict({"num_bins": 3, "emas": [{"beta": 0.95, "steps": 4, "g2": 1.0, "trace": 2.0}] * 3})
    assert e.state_dict() == d.state_dict()


# --------------------------------------------------------------------------------------------------------
# draws, argument checks, autocast, unused parameters, exact float64 rows
# --------------------------------------------------------------------------------------------------------


class RecordingData(FakeData):
    """``FakeData`` that remembers every training index asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def get(self, indices, split: str = "train"):
        self.seen.extend(int(i) for i in np.asarray(indices))
        return super().get(indices, split)


def test_draws_cover_every_example_and_both_bin_edges() -> None:
    data = RecordingData()
    _, _, t, _ = draw_examples(data, 9, 2000, 250, 259, 0.3)
    assert sorted(set(data.seen)) == list(range(EXAMPLES))  # index 0 and the last one included
    assert sorted(set(t.tolist())) == list(range(250, 260))  # lo..hi inclusive
    _, _, t, _ = draw_examples(data, 9, 5, 7, 7, 0.3)  # a one-timestep bin (K = T)
    assert t.tolist() == [7] * 5


def test_measurement_depends_on_the_seed() -> None:
    one, again, two = (_bin_gns(8, bins=3, seed=s).local_stats(5) for s in (1, 1, 2))
    assert torch.equal(one, again)
    assert all(not torch.equal(one[k, :2], two[k, :2]) for k in range(3))  # every bin draws other examples
    assert measurement_key(1, 5, 0) != measurement_key(2, 5, 0)


def _explicit_group_norms(model, batch, b: int, ctx=contextlib.nullcontext) -> tuple[float, float]:
    """``(|G_b|^2, |G_B|^2)`` from explicitly computed group gradients (``analysis.core.gns.from_subbatch_grads``)."""
    params = list(model.parameters())
    x, y, t, noise = batch
    rows = []
    for i in range(len(t) // b):
        sl = slice(b * i, b * (i + 1))
        with ctx():
            losses = per_example_loss(model, make_scheduler(), x[sl], y[sl], t[sl], noise[sl])
        grads = torch.autograd.grad(losses.mean(), params)
        rows.append(torch.cat([g.reshape(-1).double() for g in grads]).numpy())
    small, big, _, _ = from_subbatch_grads(np.stack(rows), [b] * len(rows))
    return float(small), float(big)


def test_sub_batch_norms_single_examples_and_bad_group_sizes() -> None:
    model, data, sched = Toy(), FakeData(), make_scheduler()
    params = list(model.parameters())
    batch = draw_examples(data, 5, 3, 0, 999, 0.3)
    small, big = sub_batch_sq_norms(model, params, sched, batch, 1, CPU)  # b = 1: three groups of one example
    ref_small, ref_big = _explicit_group_norms(model, batch, 1)
    assert small == pytest.approx(ref_small, rel=1e-12) and big == pytest.approx(ref_big, rel=1e-12)
    for n, b in ((5, 2), (4, 4), (4, 0)):  # a remainder, a single group, an empty group
        batch = draw_examples(data, 5, n, 0, 999, 0.3)
        msg = f"^need a batch of m >= 2 groups of b examples, got {n} examples and b={b}$"
        with pytest.raises(ValueError, match=msg):
            sub_batch_sq_norms(model, params, sched, batch, b, CPU)


class LinToy(nn.Module):
    """A float32 linear epsilon-model (CPU autocast runs ``nn.Linear`` in bfloat16); ``unused``: a trainable
    parameter the loss never touches (its gradient is zero)."""

    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(11)
        self.lin = nn.Linear(PIXELS, PIXELS)
        self.emb = nn.Embedding(CLASSES + 1, PIXELS)
        with torch.no_grad():
            self.lin.weight.copy_(0.1 * torch.randn(PIXELS, PIXELS, generator=gen))
            self.lin.bias.copy_(torch.randn(PIXELS, generator=gen))
            self.emb.weight.copy_(torch.randn(CLASSES + 1, PIXELS, generator=gen))
        if unused:
            self.unused = nn.Parameter(torch.ones(5))

    def forward(self, xt, timestep, class_labels):
        pred = self.lin(xt.flatten(1)) + self.emb(class_labels)  # (n, D)
        return SimpleNamespace(sample=pred.reshape(xt.shape))


def _bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def test_sub_batch_norms_use_the_given_autocast_and_none_runs_float32() -> None:
    model, sched = LinToy(), make_scheduler()
    params = list(model.parameters())
    batch = draw_examples(FakeData(), 77, 8, 0, 999, 0.3)
    x, y, t, noise = batch
    ref = _explicit_group_norms(copy.deepcopy(model).double(), (x.double(), y, t, noise.double()), 4)  # float64
    plain = sub_batch_sq_norms(model, params, sched, batch, 4, CPU)  # autocast=None: float32 (CPU autocast off)
    assert plain == pytest.approx(ref, rel=1e-6)
    bf16 = sub_batch_sq_norms(model, params, sched, batch, 4, CPU, _bf16)
    assert bf16 == pytest.approx(_explicit_group_norms(model, batch, 4, _bf16), rel=1e-6)  # the same bf16 pass
    assert all(abs(v / r - 1) > 1e-4 for v, r in zip(bf16, ref, strict=True))  # and bf16 really changed them


def test_unused_trainable_parameter_counts_as_zero_gradient() -> None:
    model, sched = LinToy(unused=True), make_scheduler()
    batch = draw_examples(FakeData(), 78, 8, 0, 999, 0.3)
    used = [p for name, p in model.named_parameters() if name != "unused"]
    with_unused = sub_batch_sq_norms(model, list(model.parameters()), sched, batch, 4, CPU)
    assert with_unused == pytest.approx(sub_batch_sq_norms(model, used, sched, batch, 4, CPU), rel=1e-12)


def test_local_stats_rows_are_the_float64_norms_of_the_keyed_draws_under_the_trial_autocast() -> None:
    """Each bin's row is exactly (``==``) ``sub_batch_sq_norms`` of its keyed draw run under the autocast the trial
    gave, stored in float64; ``measure`` logs the same numbers."""
    n, step = 8, 3
    cfg = TrialConfig(timestep_bins=3, gns_every=1, gns_bin_examples=n, class_dropout=0.3, seed=4)
    gns = BinGNS(cfg, LinToy(unused=True), FakeData(), make_scheduler(), 0, 1, CPU, _bf16)
    stats = gns.local_stats(step)
    assert stats.dtype == torch.float64
    logged = gns.measure(step)
    for k, (lo, hi) in enumerate(gns.bins):
        batch = draw_examples(gns.data, measurement_key(4, step, k), n, lo, hi, 0.3)
        small, big = sub_batch_sq_norms(gns.model, gns.params, gns.scheduler, batch, n // 2, CPU, _bf16)
        assert stats[k].tolist() == [small, big, n // 2, n]
        assert (logged[M.per_bin(M.GNS_BIN_G2_SMALL, k)], logged[M.per_bin(M.GNS_BIN_G2_BIG, k)]) == (small, big)
        assert (small, big) != sub_batch_sq_norms(gns.model, gns.params, gns.scheduler, batch, n // 2, CPU)


def test_bin_examples_must_be_even_and_at_least_two() -> None:
    assert _bin_gns(2, bins=2).local_stats(1)[:, 2:].tolist() == [[1, 2], [1, 2]]  # two halves of one example
    for n in (1, 3):  # gns_every=0 skips the config's own check: BinGNS checks again
        cfg = TrialConfig(timestep_bins=2, gns_every=0, gns_bin_examples=n)
        with pytest.raises(ValueError, match=f"^per-bin GNS needs an even number >= 2 of examples per bin, got {n}$"):
            BinGNS(cfg, Toy(), FakeData(), make_scheduler(), 0, 1, CPU, contextlib.nullcontext)


def test_measure_with_two_ranks_sums_their_tables(monkeypatch) -> None:
    """``W = 2`` in this process: a stand-in ``all_reduce`` adds rank 1's table to rank 0's (what gloo does, as
    ``test_gns_collection.py``'s spawned ``W = 2`` test checks for real), and rank 0 then logs every bin, the same
    numbers as a ``W = 1`` measurement."""
    step = 6
    rank1 = _bin_gns(8, bins=5, rank=1, world=2).local_stats(step)

    def all_reduce(t: torch.Tensor) -> None:
        t += rank1  # in place, like torch.distributed.all_reduce (SUM)

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    assert _bin_gns(8, bins=5, rank=0, world=2).measure(step) == _bin_gns(8, bins=5).measure(step)


def test_measurement_keys_are_private_per_bin_and_disjoint_from_training_keys() -> None:
    """Each (seed, step, bin) measurement has its own generator, and no measurement key equals a training step's
    key (``randomness.step_key``) or an epoch permutation's (``mix(seed, STREAM_EPOCH, epoch)``): the per-bin GNS
    never reuses the examples or noise of training."""
    from trainables.randomness import STREAM_EPOCH, mix, step_key

    seeds, steps, bins = range(3), range(12), range(10)
    gns = {measurement_key(s, t, k) for s in seeds for t in steps for k in bins}
    assert len(gns) == len(seeds) * len(steps) * len(bins)  # bins of one measurement draw independently
    training = {step_key(s, t) for s in seeds for t in steps} | {mix(s, STREAM_EPOCH, e) for s in seeds for e in steps}
    assert not gns & training
