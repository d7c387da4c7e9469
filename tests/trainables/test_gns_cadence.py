"""Global GNS on a sparse schedule (`gns_global_every`, issue 43): only every k-th optimizer step is measured.

McCandlish et al. 2018 (arXiv 1812.06162, App. A.1): each measurement's two-batch estimates of ``|G|^2`` and
``tr(Sigma)`` are unbiased whatever steps are chosen, as long as the choice does not depend on the draws; the window
(``analysis.core.gns.GNSWindow``) then averages k times fewer of them. Checked here, in float64 against a synthetic
population of per-example gradients whose ``|G|^2`` and ``tr(Sigma)`` are known exactly:
- the schedule (`measures_global`) and its resolution per mode (`global_gns_every`);
- a step simulated as the trial runs it (pieces into ``.grad``, `PieceNorms` reading them) at cadence k: the window
  means over the measured steps are unbiased, and the reported SE covers the truth as often as a standard error
  should (window of ``GLOBAL_MIN_MEASUREMENTS``);
- the real `TrainStep`: a skipped step runs exactly one backward per micro-batch, reads no norms, reports no small
  batch and leaves ``.grad`` bit-identical to global GNS off; a measured step runs the two halves;
- the trial: measurements logged at steps k, 2k, ... only, the live B_simple equal to the offline re-smoothing,
  the cadence in the summary, and a one-line ConfigError for a bad ``gns_global_every``.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch

import trainables.step as step_module
from analysis.core import metrics as M
from analysis.core.gns import GNSWindow, g2_unbiased, trace_unbiased, window_b_simple
from trainables.config import (
    GLOBAL_EVERY_AUTO,
    GLOBAL_MIN_MEASUREMENTS,
    MICRO_EVERY_AUTO,
    ConfigError,
    TrialConfig,
    global_gns_every,
    measures_global,
)
from trainables.data import load_dataset
from trainables.diffusion import make_scheduler
from trainables.gns_stats import PieceNorms, sq_norm
from trainables.presets import build_dit
from trainables.step import TrainStep
from trainables.trial import run_local

POP, DIM, MICRO = 48, 5, 8  # population of per-example gradients, their dimension, examples per step (halves of 4)


@pytest.fixture(scope="module")
def population():
    """Per-example gradients (POP, DIM) float64 with a mean offset; the exact |G|^2 and tr(Sigma) of one iid draw."""
    rng = np.random.default_rng(0)
    grads = rng.normal(size=(POP, DIM)) * np.linspace(0.5, 1.5, DIM) + 0.6
    mean = grads.mean(0)
    return torch.from_numpy(grads), float(mean @ mean), float(((grads - mean) ** 2).sum(1).mean())


def _step(param: torch.Tensor, grads: torch.Tensor, idx: np.ndarray, measured: bool) -> tuple[float | None, float]:
    """One simulated W = A = 1 step over the examples ``idx``, as `TrainStep` runs it: a measured step adds the two
    halves' shares ``(n_j / N) g_j`` to ``.grad`` with `PieceNorms` reading each; a skipped one adds the whole mean
    in one piece and reads nothing. ``(g2_small or None, |G_N|^2)``."""
    param.grad = None
    n = len(idx)
    if not measured:
        param.grad = grads[idx].mean(0).clone()
        return None, float(sq_norm([param.grad]))
    pieces = PieceNorms([param], n)
    cuts = [(0, n // 2), (n // 2, n)]
    for j, (lo, hi) in enumerate(cuts):
        share = grads[idx[lo:hi]].sum(0) / n
        param.grad = share.clone() if param.grad is None else param.grad + share
        pieces.after_piece(hi - lo, last=j == len(cuts) - 1)
    small, k = pieces.pop_tensor()
    assert k == 2
    return float(small), float(sq_norm([param.grad]))


def test_cadence_per_mode_and_schedule() -> None:
    assert global_gns_every("halves", 0) == GLOBAL_EVERY_AUTO == 40
    assert global_gns_every("micro-batches", 0) == MICRO_EVERY_AUTO == 4  # auto: its norms cost 4-6% of a step, /4
    assert global_gns_every("halves", 5) == global_gns_every("micro-batches", 5) == 5
    assert global_gns_every("ranks", 5) == 1  # the local norm rides on the all-reduce: every step
    assert global_gns_every("off", 5) == global_gns_every("unavailable", 1) == 0
    assert [s for s in range(12) if measures_global(s, 4)] == [3, 7, 11]  # the 4th, 8th, 12th step done
    assert all(measures_global(s, 1) for s in range(5)) and not any(measures_global(s, 0) for s in range(5))


def test_sparse_window_means_are_unbiased_float64(population) -> None:
    """2400 steps at k = 6: the 400 measured steps' unbiased |G|^2 and tr(Sigma) average to the truth (|z| < 4),
    each measured value equals the every-step schedule's on the same draws, and the skipped steps add nothing."""
    grads, g2_true, tr_true = population
    param = torch.zeros(DIM, dtype=torch.float64, requires_grad=True)
    rng = np.random.default_rng(1)
    k, b, B = 6, MICRO / 2, MICRO
    window = GNSWindow(window=10**6)  # holds every measurement
    g2s, trs = [], []
    for s in range(2400):
        idx = rng.integers(0, POP, MICRO)
        small, big = _step(param, grads, idx, measures_global(s, k))
        assert big == pytest.approx(float(grads[idx].mean(0) @ grads[idx].mean(0)), rel=1e-12)
        if small is None:
            assert not measures_global(s, k)
            continue
        every, _ = _step(param, grads, idx, True)
        assert small == every  # the schedule picks steps; it does not change a measurement
        window.update(s + 1, small, big, b, B)
        g2s.append(g2_unbiased(small, big, b, B))
        trs.append(trace_unbiased(small, big, b, B))
    assert len(g2s) == 400 == window.estimate.n
    for est, truth in ((np.array(g2s), g2_true), (np.array(trs), tr_true)):
        z = (est.mean() - truth) / (est.std(ddof=1) / math.sqrt(est.size))
        assert abs(z) < 4, (est.mean(), truth, z)


def test_sparse_window_se_is_honest_float64(population) -> None:
    """Independent windows of GLOBAL_MIN_MEASUREMENTS measurements at k = 40 (320 steps each): the reported SE
    covers the true B_simple about as often as a standard error from 8 draws does (~68% within 1 SE; within 2 SE
    somewhat less than 95%), and the window value is centred on the truth (its median within 5%)."""
    grads, g2_true, tr_true = population
    truth = tr_true / g2_true
    rng = np.random.default_rng(2)
    k, n_windows = GLOBAL_EVERY_AUTO, 600
    b, B = MICRO / 2, MICRO
    values, ses = [], []
    for _ in range(n_windows):
        window = GNSWindow(window=GLOBAL_MIN_MEASUREMENTS * k)
        for s in range(GLOBAL_MIN_MEASUREMENTS * k):
            if measures_global(s, k):  # a skipped step's draw does not enter the estimate
                idx = rng.integers(0, POP, MICRO)
                halves = [grads[idx[: MICRO // 2]].mean(0), grads[idx[MICRO // 2 :]].mean(0)]
                small = float(sum(h @ h for h in halves)) / 2
                whole = grads[idx].mean(0)
                est = window.update(s + 1, small, float(whole @ whole), b, B)
        assert est.n == GLOBAL_MIN_MEASUREMENTS
        if est.ok:
            values.append(est.value)
            ses.append(est.se)
    values, ses = np.array(values), np.array(ses)
    assert values.size >= 0.97 * n_windows  # a window without a positive mean |G|^2 is rare at this size
    within1 = float(np.mean(np.abs(values - truth) <= ses))
    within2 = float(np.mean(np.abs(values - truth) <= 2 * ses))
    # measured: 0.70 and 0.88 (a t with 7 degrees of freedom: 0.65 and 0.91; the ratio's skew thins the far tail)
    assert 0.60 <= within1 <= 0.80 and within2 >= 0.85, (within1, within2)
    assert abs(np.median(values) / truth - 1) < 0.05


@pytest.fixture(scope="module")
def parts():
    torch.manual_seed(0)
    model = build_dit("tiny", sample_size=8, in_channels=1, num_classes=10).train()
    return model, load_dataset("digits", 297), make_scheduler()


def _counted_step(cfg: TrialConfig, model, data, sched, step: int, monkeypatch) -> tuple:
    """Run one `TrainStep` from ``model``'s weights; ``(stats, flat .grad, backward sizes, norm reads)``."""
    sizes, reads = [], []
    real_loss, real_after = step_module.per_example_loss, PieceNorms.after_piece

    def loss(m, s, x, *rest):
        sizes.append(len(x))
        return real_loss(m, s, x, *rest)

    def after(self, n, last):
        reads.append(n)
        return real_after(self, n, last)

    monkeypatch.setattr(step_module, "per_example_loss", loss)
    monkeypatch.setattr(PieceNorms, "after_piece", after)
    backwards = []
    real_backward = torch.Tensor.backward
    monkeypatch.setattr(torch.Tensor, "backward", lambda t, *a, **kw: (backwards.append(1), real_backward(t, *a, **kw)))
    model.zero_grad(set_to_none=True)
    ts = TrainStep(cfg, model, model, data, sched, 0, 1, torch.device("cpu"), contextlib.nullcontext)
    try:
        stats = ts(step)
    finally:
        ts.close()
        monkeypatch.undo()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).clone()
    assert len(backwards) == len(sizes)  # one backward per forward
    return stats, grad, sizes, reads


@pytest.mark.parametrize("micro, batch", [(8, 8), (4, 8)])  # halves (A = 1); micro-batches (A = 2), k set
def test_a_skipped_step_is_the_step_of_global_gns_off(parts, monkeypatch, micro, batch) -> None:
    model, data, sched = parts
    base = dict(preset="tiny", batch_size=batch, micro_batch_size=micro, seed=3, prefetch=0)
    sparse, off = TrialConfig(**base, gns_global_every=4), TrialConfig(**base, gns=False)
    accum = batch // micro
    for step in (4, 6):  # neither is the 4th, 8th, ... step done
        s, grad, sizes, reads = _counted_step(sparse, model, data, sched, step, monkeypatch)
        o, grad_off, sizes_off, _ = _counted_step(off, model, data, sched, step, monkeypatch)
        assert sizes == sizes_off == [micro] * accum  # exactly one backward per micro-batch
        assert reads == [] and s.g2_small is None and s.b_small is None
        assert torch.equal(grad, grad_off) and s.loss == o.loss and s.g2_big == o.g2_big  # bit-identical
    s, grad, sizes, reads = _counted_step(sparse, model, data, sched, 7, monkeypatch)  # the 8th step: measured
    assert sizes == ([micro // 2, micro - micro // 2] if accum == 1 else [micro] * accum)
    assert len(reads) == len(sizes) and s.g2_small is not None and s.b_small == (micro / 2 if accum == 1 else micro)


TINY = dict(preset="tiny", eval_every=4, eval_repeats=1, timestep_bins=4, gns_every=0)


def _series(session, name: str) -> list[tuple[int, float]]:
    return [(r[0], r[3]) for rep in session.reports for r in rep["rows"] if r[2] == name]


def test_trial_logs_every_kth_step_and_says_its_cadence() -> None:
    cfg = TrialConfig(**TINY, batch_size=8, micro_batch_size=8, max_steps=24, gns_global_every=3, gns_window=12)
    s = run_local(cfg)
    steps = [n for n, _ in _series(s, M.GNS_G2_SMALL)]
    assert steps == list(range(3, 25, 3))  # the 3rd, 6th, ... step done
    assert len(_series(s, M.TRAIN_LOSS)) == 24
    cols = [[v for _, v in _series(s, n)] for n in (M.GNS_G2_SMALL, M.GNS_G2_BIG, M.GNS_B_SMALL, M.GNS_B_BIG)]
    offline, _ = window_b_simple(steps, *cols, window=12, half=True)  # the one rule, live and offline
    live = dict(_series(s, M.GNS_B_SIMPLE))
    assert live and all(v == pytest.approx(offline[steps.index(n)], rel=1e-12) for n, v in live.items())
    # at step 24 the window (the last 12 steps, at most half) holds the 4 measurements of steps 15..24
    assert s.summary["gns_global"].startswith("on: halves, every 3 steps (only 4 measurements in the last window")
    every = run_local(cfg.replace(gns_global_every=1, max_steps=16))
    assert every.summary["gns_global"] == "on: halves, every step"  # 8 measurements (steps 9..16): enough
    auto = TrialConfig(**TINY, batch_size=8, micro_batch_size=8, max_steps=2)
    assert run_local(auto).summary["gns_global"].startswith(f"on: halves, every {GLOBAL_EVERY_AUTO} steps (only 0")


def test_config_cadence_checks_and_auto_window() -> None:
    halves = dict(batch_size=32, micro_batch_size=32)
    assert TrialConfig(**halves).global_gns_stages == [("halves", GLOBAL_EVERY_AUTO)]
    assert TrialConfig(**halves).gns_steps == GLOBAL_MIN_MEASUREMENTS * GLOBAL_EVERY_AUTO  # 8 measurements
    assert TrialConfig(**halves, gns_global_every=1).gns_steps == 100  # the reference: the old auto window
    assert TrialConfig(batch_size=32, micro_batch_size=16).global_gns_stages == [("micro-batches", MICRO_EVERY_AUTO)]
    sched = TrialConfig(batch_size=8, micro_batch_size=8, batch_schedule=[[3, 16]])
    assert sched.global_gns_stages == [("halves", GLOBAL_EVERY_AUTO), ("micro-batches", MICRO_EVERY_AUTO)]
    assert TrialConfig(**halves, gns_every=1000, max_steps=5000).gns_steps == 4000  # 4 per-bin measurements
    assert TrialConfig(**halves, max_steps=6, gns_window=4).gns_steps == 4  # auto cadence: never an error
    for kw, match in [
        (dict(gns_global_every=-1), r"gns_global_every must be an integer in \[0, "),
        (dict(gns_global_every=1.5), "must be int"),
        (dict(gns_global_every=300, max_steps=200), "global GNS would never measure; set it <= 200"),
        (dict(gns_global_every=10, gns_window=15), "gns_window >= 20"),
    ]:
        with pytest.raises(ConfigError, match=match) as e:
            TrialConfig.from_dict({**halves, **kw})
        assert "\n" not in str(e.value)
    TrialConfig(**halves, gns_global_every=10, gns_window=20)  # 2 measurements: allowed
    TrialConfig(batch_size=64, micro_batch_size=32, num_workers=2, gns_global_every=500)  # ranks: k does not apply
