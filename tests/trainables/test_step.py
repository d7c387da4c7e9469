"""One optimizer step (`trainables.step.TrainStep`, W = 1): for ANY split of the same effective batch into
micro-batches (and into halves, `gns_halves`), the loss and the gradient equal a float64 reference computed on the
whole batch at once; the global GNS statistics it reports are those of the documented small and big batches: every
micro-batch (A >= 2) or both halves of the micro-batch (A = 1), size-weighted. (W >= 2: test_gns_collection.py;
unbiasedness over many draws: test_gns_pieces.py.)"""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import trainables.step as step_module
from trainables.config import TrialConfig
from trainables.data import load_dataset
from trainables.diffusion import NUM_TIMESTEPS, make_scheduler, per_example_loss
from trainables.presets import build_dit
from trainables.randomness import global_batch_indices, step_draws
from trainables.step import TrainStep, global_gns_available

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def parts():
    torch.manual_seed(0)
    model = build_dit("tiny", sample_size=8, in_channels=1, num_classes=10).train()
    return model, copy.deepcopy(model).double(), load_dataset("digits", 297), make_scheduler()


def _reference(cfg: TrialConfig, ref, data, sched, step: int, positions: range | None = None):
    """float64 mean loss and flat gradient over ``positions`` of the global batch (default: all of it)."""
    positions = positions if positions is not None else range(cfg.batch_size)
    idx = global_batch_indices(cfg.seed, step, cfg.batch_size, data.info.train_size)[positions.start : positions.stop]
    x, y = data.get(idx)
    t, u, noise = (
        d[positions.start : positions.stop]
        for d in step_draws(cfg.seed, step, cfg.batch_size, x.shape[1:], NUM_TIMESTEPS)
    )
    y = torch.where(u < cfg.class_dropout, data.info.num_classes, y)
    loss = per_example_loss(ref, sched, x.double(), y, t, noise.double()).mean()
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    return float(loss), torch.cat([g.reshape(-1) for g in grads])


def _small_reference(cfg: TrialConfig, ref, data, sched, step: int) -> tuple[float, float]:
    """float64 ``(g2_small, b)``: pieces = the micro-batches (A >= 2) or the two halves of the one micro-batch
    (A = 1, odd sizes included), ``g2_small = sum_j (n_j / B) |g_j|^2``, ``b = B / (number of pieces)``."""
    micro, B = cfg.micro_batch_size, cfg.batch_size
    if cfg.accum >= 2:
        cuts = [range(m * micro, (m + 1) * micro) for m in range(cfg.accum)]
    else:
        cuts = [range(0, micro // 2), range(micro // 2, micro)]
    total = 0.0
    for c in cuts:
        _, g = _reference(cfg, ref, data, sched, step, c)
        total += len(c) / B * float(g @ g)
    return total, B / len(cuts)


def _run(cfg: TrialConfig, model, data, sched, step: int):
    model.zero_grad(set_to_none=True)
    s = TrainStep(cfg, model, model, data, sched, 0, 1, CPU, contextlib.nullcontext)(step)
    grad = torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])
    return s, grad


@settings(max_examples=6, deadline=None)
@given(
    split=st.sampled_from(
        [(8, 8), (8, 4), (8, 2), (12, 4), (12, 3), (16, 16), (16, 8), (16, 4), (16, 1), (6, 2), (9, 9), (5, 5)]
    ),
    seed=st.integers(0, 10**6),
    step=st.integers(0, 500),
    dropout=st.sampled_from([0.0, 0.5]),
)
def test_any_micro_split_gives_the_whole_batch_loss_and_gradient(parts, split, seed, step, dropout) -> None:
    model, ref, data, sched = parts
    B, micro = split
    cfg = TrialConfig(batch_size=B, micro_batch_size=micro, seed=seed, class_dropout=dropout, gns_global_every=1)
    s, grad = _run(cfg, model, data, sched, step)
    loss, ref_grad = _reference(cfg, ref, data, sched, step)
    assert s.loss == pytest.approx(loss, rel=1e-5)
    assert float((grad - ref_grad).norm()) <= 1e-5 * float(ref_grad.norm())
    assert s.g2_big == pytest.approx(float(ref_grad @ ref_grad), rel=1e-5)
    assert s.b_big == B and s.finite
    g2_small, b = _small_reference(cfg, ref, data, sched, step)  # A = 1: the halves; A >= 2: every micro-batch
    assert s.b_small == b == (micro / 2 if micro == B else micro)
    assert s.g2_small == pytest.approx(g2_small, rel=1e-5)


def test_w1_a1_without_halves_has_no_small_batch(parts) -> None:
    model, ref, data, sched = parts
    cfg = TrialConfig(batch_size=8, micro_batch_size=8, seed=5, gns=True, gns_halves=False)
    s, grad = _run(cfg, model, data, sched, 2)
    assert s.g2_small is None and s.b_small is None
    _, ref_grad = _reference(cfg, ref, data, sched, 2)
    assert float((grad - ref_grad).norm()) <= 1e-5 * float(ref_grad.norm())


def test_gns_off_reports_no_small_batch(parts) -> None:
    model, _, data, sched = parts
    s, _ = _run(TrialConfig(batch_size=8, micro_batch_size=4, gns=False), model, data, sched, 3)
    assert s.g2_small is None and s.b_small is None and s.b_big == 8


def test_label_dropout_changes_the_step(parts) -> None:
    """Labels dropped to the null class with probability class_dropout (the reference above follows the same rule)."""
    model, _, data, sched = parts
    a, _ = _run(TrialConfig(batch_size=16, micro_batch_size=16, class_dropout=0.0), model, data, sched, 1)
    b, _ = _run(TrialConfig(batch_size=16, micro_batch_size=16, class_dropout=0.9), model, data, sched, 1)
    assert a.loss != b.loss


def test_non_finite_step_is_flagged(parts) -> None:
    model, _, data, sched = parts
    broken = copy.deepcopy(model)
    with torch.no_grad():
        next(broken.parameters()).fill_(float("nan"))
    s, _ = _run(TrialConfig(batch_size=8, micro_batch_size=4), broken, data, sched, 0)
    assert not s.finite


def test_global_gns_availability() -> None:
    def mode(**kw) -> str:
        cfg = TrialConfig(**{"batch_size": 8, "micro_batch_size": 8, **kw})
        assert global_gns_available(cfg) == (cfg.global_gns in ("ranks", "micro-batches", "halves"))
        return cfg.global_gns

    assert mode() == "halves" and mode(gns_halves=False) == "unavailable" and mode(gns=False) == "off"
    assert mode(batch_size=1, micro_batch_size=1) == "unavailable"  # one example: no two batch sizes
    assert mode(micro_batch_size=4) == "micro-batches" and mode(micro_batch_size=4, gns_halves=False) == "micro-batches"
    assert mode(micro_batch_size=4, num_workers=2) == "ranks" and mode(micro_batch_size=2, num_workers=2) == "ranks"


def _capture_losses(monkeypatch, values=None) -> list[torch.Tensor]:
    """Wrap the ``per_example_loss`` the step calls: record each piece's float32 per-example losses (the same
    forward the step ran). With ``values`` (one per example, in order), the step sees those values instead, with
    the real losses' gradient (``v + (l - l.detach())``: exactly ``v``)."""
    seen: list[torch.Tensor] = []

    def wrapped(*args, **kwargs):
        losses = per_example_loss(*args, **kwargs)
        if values is not None:
            v = values[sum(len(p) for p in seen) :][: len(losses)]
            losses = v.to(losses.dtype) + (losses - losses.detach())  # exactly v, with the gradient of l
        seen.append(losses.detach().clone())
        return losses

    monkeypatch.setattr(step_module, "per_example_loss", wrapped)
    return seen


def test_loss_is_summed_in_float64(parts, monkeypatch) -> None:
    """The reported loss is the float64 sum of the float32 per-example losses of the step's own forward (here the
    two GNS halves of one micro-batch of 16), over B. Values chosen so that every float32 accumulation is inexact on
    any CPU: fifteen 1.0 and one 3 * 2^-24 sum to 15 + 3 * 2^-24, which float64 holds exactly (so any summation
    order gives it, ``==`` is exact) and float32 cannot (its spacing at 8..16 is 2^-20)."""
    model, _, data, sched = parts
    cfg = TrialConfig(batch_size=16, micro_batch_size=16, seed=3, gns_global_every=1)  # halves at every step
    values = torch.ones(16, dtype=torch.float32)
    values[-1] = 3 * 2.0**-24
    seen = _capture_losses(monkeypatch, values)
    s, _ = _run(cfg, model, data, sched, 2)
    assert [len(p) for p in seen] == [8, 8]  # the step's pieces: the two halves
    assert s.loss == (15 + 3 * 2.0**-24) / 16
    assert float(values.sum()) != 15 + 3 * 2.0**-24  # (the values do tell a float32 accumulator apart)


def test_loss_is_the_mean_of_the_forward_it_ran(parts, monkeypatch) -> None:
    """The real losses: the reported loss is the mean of the per-example losses the step's forward produced (not
    of another forward of the same examples: a different split runs different float32 kernels). Tolerance: 16
    float64 additions, each rounding by at most 2^-53 of the running sum."""
    model, _, data, sched = parts
    cfg = TrialConfig(batch_size=16, micro_batch_size=8, seed=3)
    seen = _capture_losses(monkeypatch)
    s, _ = _run(cfg, model, data, sched, 2)
    each = torch.cat(seen)
    assert len(each) == 16 and each.dtype == torch.float32
    assert s.loss == pytest.approx(math.fsum(each.tolist()) / 16, rel=16 * 2.0**-53, abs=0)


def test_every_micro_batch_counts_in_the_small_batch(parts) -> None:
    """A = 3: b = micro, |G_b|^2 the mean over ALL micro-batches of their own mean-loss gradients' squared norms
    (not the first one's alone: that wastes A - 1 small-batch gradients)."""
    model, ref, data, sched = parts
    cfg = TrialConfig(batch_size=12, micro_batch_size=4, seed=11, gns=True, gns_global_every=1)
    s, _ = _run(cfg, model, data, sched, 4)
    each = [_reference(cfg, ref, data, sched, 4, range(4 * m, 4 * m + 4))[1] for m in range(3)]
    assert s.b_small == 4 and s.g2_small == pytest.approx(sum(float(g @ g) for g in each) / 3, rel=1e-5)
    assert s.g2_small != pytest.approx(float(each[0] @ each[0]), rel=1e-3)  # the draw differs from the first's


@pytest.mark.parametrize("micro", [5, 8])
def test_halves_give_the_whole_gradient_and_the_size_weighted_halves(parts, micro) -> None:
    """A = 1 with gns_halves: two backward passes (2 + 3 examples for micro 5) whose sum is the whole micro-batch's
    mean gradient (the same update as one backward, up to float rounding); b = micro / 2 even for an odd micro."""
    model, ref, data, sched = parts
    cfg = TrialConfig(batch_size=micro, micro_batch_size=micro, seed=13, gns_global_every=1)  # the reference cadence
    s, grad = _run(cfg, model, data, sched, 6)
    loss, ref_grad = _reference(cfg, ref, data, sched, 6)
    assert s.loss == pytest.approx(loss, rel=1e-5)
    assert float((grad - ref_grad).norm()) <= 1e-5 * float(ref_grad.norm())
    g2_small, b = _small_reference(cfg, ref, data, sched, 6)
    assert s.b_small == b == micro / 2 and s.g2_small == pytest.approx(g2_small, rel=1e-5)
    one, grad1 = _run(cfg.replace(gns_halves=False), model, data, sched, 6)  # one backward: same step up to rounding
    assert one.loss == pytest.approx(s.loss, rel=1e-6) and one.g2_small is None
    assert float((grad - grad1).norm()) <= 1e-5 * float(grad1.norm())
