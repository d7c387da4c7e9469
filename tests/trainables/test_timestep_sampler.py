"""Non-uniform timestep sampling in the DiT trial (`trainables.timestep_sampler`, docs/allocation.md).

- the step under a skewed allocation equals a float64 reference built independently: the same keyed generator,
  the bins by `tests.oracles.allocation.sample_bins` (numpy inverse CDF), each loss weighted by ``q_k / p_k``; for
  every split of the batch into micro-batches (split invariance);
- a trial with ``noise`` / ``loss`` re-estimates and logs its allocation, resumes bit for bit, and its checkpoint
  state is JSON;
- bad settings are one ConfigError line.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis.core.allocation import bin_shares, noise_allocation
from analysis.core.bins import timestep_bins
from tests.oracles.allocation import sample_bins
from trainables.config import ConfigError, TrialConfig
from trainables.data import load_dataset
from trainables.diffusion import NUM_TIMESTEPS, make_scheduler, per_example_loss
from trainables.presets import build_dit
from trainables.randomness import global_batch_indices, step_key
from trainables.step import TrainStep
from trainables.timestep_sampler import TimestepSampler
from trainables.trial import run_local

CPU = torch.device("cpu")
SKEWED = np.array([0.3, 0.05, 0.05, 0.1, 0.5])  # K = 5


@pytest.fixture(scope="module")
def parts():
    torch.manual_seed(0)
    model = build_dit("tiny", sample_size=8, in_channels=1, num_classes=10).train()
    return model, copy.deepcopy(model).double(), load_dataset("digits", 297), make_scheduler()


def _reference(cfg, ref, data, sched, step, p):
    """float64 weighted mean loss and flat gradient of the whole global batch, drawn without the sampler."""
    B = cfg.batch_size
    idx = global_batch_indices(cfg.seed, step, B, data.info.train_size)
    x, y = data.get(idx)
    g = torch.Generator().manual_seed(step_key(cfg.seed, step))
    torch.randint(0, NUM_TIMESTEPS, (B,), generator=g)  # the uniform timesteps, replaced below
    u = torch.rand(B, generator=g)
    noise = torch.randn((B, *x.shape[1:]), generator=g)
    v = torch.rand(B, generator=g, dtype=torch.float64).numpy()
    r = torch.rand(B, generator=g, dtype=torch.float64).numpy()
    k = sample_bins(v, p)
    lo = np.array([a for a, _ in timestep_bins(len(p))])
    width = np.array([b - a + 1 for a, b in timestep_bins(len(p))])
    t = torch.from_numpy(lo[k] + np.floor(r * width[k]).astype(np.int64))
    w = torch.from_numpy(bin_shares(len(p)) / p)[torch.from_numpy(k)]
    y = torch.where(u < cfg.class_dropout, data.info.num_classes, y)
    loss = (per_example_loss(ref, sched, x.double(), y, t, noise.double()) * w).mean()
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    return float(loss), torch.cat([gr.reshape(-1) for gr in grads])


@pytest.mark.parametrize("micro", [8, 2])
def test_weighted_step_equals_float64_reference_for_any_split(parts, micro):
    model, ref, data, sched = parts
    kw = dict(seed=3, timestep_bins=5, timestep_sampling="loss", gns_global_every=1)  # A = 1: halves at every step
    cfg = TrialConfig(batch_size=8, micro_batch_size=micro, **kw)
    sampler = TimestepSampler(cfg, NUM_TIMESTEPS, CPU)
    sampler.p = SKEWED.copy()
    model.zero_grad(set_to_none=True)
    s = TrainStep(cfg, model, model, data, sched, 0, 1, CPU, contextlib.nullcontext, None, sampler)(11)
    grad = torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])
    loss, ref_grad = _reference(cfg, ref, data, sched, 11, SKEWED)
    assert s.loss == pytest.approx(loss, rel=1e-5)
    assert float((grad - ref_grad).norm()) <= 1e-5 * float(ref_grad.norm())
    # the same step without weights (uniform p = q, other draws) is far away: the tolerance means something
    sampler.p = bin_shares(5)
    model.zero_grad(set_to_none=True)
    TrainStep(cfg, model, model, data, sched, 0, 1, CPU, contextlib.nullcontext, None, sampler)(11)
    other = torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])
    assert float((other - ref_grad).norm()) > 1e-2 * float(ref_grad.norm())


def test_draws_follow_the_allocation_and_stay_in_their_bins():
    cfg = TrialConfig(timestep_bins=5, timestep_sampling="loss")
    sampler = TimestepSampler(cfg, NUM_TIMESTEPS, CPU)
    sampler.p = SKEWED.copy()
    t, w, k = sampler.draw(torch.Generator().manual_seed(1), 200_000)
    freq = np.bincount(k.numpy(), minlength=5) / k.numel()
    assert np.all(np.abs(freq - SKEWED) < 4 * np.sqrt(SKEWED * (1 - SKEWED) / k.numel()))
    lo = torch.tensor([a for a, _ in timestep_bins(5)])
    hi = torch.tensor([b for _, b in timestep_bins(5)])
    assert bool(((t >= lo[k]) & (t <= hi[k])).all())
    assert len(torch.unique(t[k == 1])) == 200  # every timestep of a bin is drawn (within-bin uniform)
    np.testing.assert_allclose(w.numpy(), (bin_shares(5) / SKEWED)[k.numpy()], rtol=1e-6)


TINY = dict(preset="tiny", batch_size=8, micro_batch_size=8, eval_every=4, eval_repeats=1, max_steps=12,
            timestep_bins=4, gns_every=4, gns_bin_examples=4, alloc_every=4, alloc_history=2)  # fmt: skip


def _rows(session, prefix):
    return [(r[0], r[2], r[3]) for rep in session.reports for r in rep["rows"] if r[2].startswith(prefix)]


@pytest.mark.parametrize("kind", ["noise", "loss"])
def test_sampler_trial_resumes_bit_for_bit_and_logs_its_allocation(tmp_path, kind):
    cfg = TrialConfig(**TINY, timestep_sampling=kind)
    straight = run_local(cfg)
    first = run_local(cfg.replace(max_steps=8), checkpoint_root=str(tmp_path))
    resumed = run_local(cfg, resume_from=first.checkpoints[-1])
    state = torch.load(f"{first.checkpoints[-1]}/state.pt", weights_only=True)["timestep_sampler"]
    assert json.loads(json.dumps(state)) == state and state["kind"] == kind
    joined = [r for r in _rows(first, "train/loss")] + [r for r in _rows(resumed, "train/loss") if r[0] > 8]
    assert joined == _rows(straight, "train/loss")  # bit-identical on CPU
    alloc = _rows(straight, "alloc/")
    assert sorted({s for s, _, _ in alloc}) == [4, 8, 12]
    last = np.array([v for s, _, v in alloc if s == 12])
    assert last.sum() == pytest.approx(1.0) and np.all(last >= 0.1 * 0.25 - 1e-12)
    assert np.abs(last - 0.25).max() > 1e-3  # it moved away from uniform
    assert joined != _rows(run_local(TrialConfig(**TINY)), "train/loss")  # and it changes training


def test_noise_allocation_is_neyman_on_the_per_bin_window():
    cfg = TrialConfig(**{**TINY, "max_steps": 8}, timestep_sampling="noise")
    s = run_local(cfg)
    rows = _rows(s, "gns/bin")
    m = [np.mean([v for st, n, v in rows if n == f"gns/bin{k}/g2"])
         + np.mean([v for st, n, v in rows if n == f"gns/bin{k}/trace"]) for k in range(4)]  # fmt: skip
    logged = [v for st, n, v in _rows(s, "alloc/") if st == 8]
    np.testing.assert_allclose(logged, noise_allocation(m, bin_shares(4), 0.1), rtol=1e-9)


def test_sampler_settings_are_checked():
    with pytest.raises(ConfigError, match="timestep_sampling must be one of"):
        TrialConfig(timestep_sampling="snr")
    with pytest.raises(ConfigError, match="set gns_every"):
        TrialConfig(timestep_sampling="noise", gns_every=0)
    with pytest.raises(ConfigError, match="alloc_floor"):
        TrialConfig(timestep_sampling="loss", alloc_floor=0.0)


def _ddp_worker(rank: int, world: int, init_method: str, out_dir: str) -> None:
    """One rank of a W=2 gloo group: one weighted step of the whole batch split over the ranks (A = 2 each)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        cfg = TrialConfig(batch_size=8, micro_batch_size=2, num_workers=2, seed=3, timestep_bins=5,
                          timestep_sampling="loss", alloc_history=1)  # fmt: skip
        torch.manual_seed(0)
        model = build_dit("tiny", sample_size=8, in_channels=1, num_classes=10).train()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        sampler = TimestepSampler(cfg, NUM_TIMESTEPS, CPU)
        sampler.p = SKEWED.copy()
        data, sched = load_dataset("digits", 297), make_scheduler()
        s = TrainStep(cfg, model, ddp, data, sched, rank, world, CPU, contextlib.nullcontext, None, sampler)(11)
        grad = torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])
        out = {"loss": s.loss, "grad": grad.tolist(), "history": sampler.history}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # spawns a 2-process gloo group: ~10-30 s
def test_two_workers_take_the_one_worker_weighted_step(parts, tmp_path):
    """W = 2 x A = 2 x micro 2 gives the W = 1 float64 reference update, and both ranks hold the same per-bin loss
    history (the all-reduced per-bin sums): the draws and the allocation's inputs are split-invariant."""
    from ddp_group import run_group

    _, ref, data, sched = parts
    ranks = run_group(_ddp_worker, 2, tmp_path, timeout_s=180.0)
    cfg = TrialConfig(batch_size=8, micro_batch_size=8, seed=3, timestep_bins=5, timestep_sampling="loss")
    loss, ref_grad = _reference(cfg, ref, data, sched, 11, SKEWED)
    for r in ranks:
        grad = torch.tensor(r["grad"], dtype=torch.float64)
        assert r["loss"] == pytest.approx(loss, rel=1e-5)
        assert float((grad - ref_grad).norm()) <= 1e-5 * float(ref_grad.norm())
    assert ranks[0]["history"] == ranks[1]["history"] and sum(len(h) for h in ranks[0]["history"]) >= 2
