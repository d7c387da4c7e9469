"""adaLN-gradient GNS collection (trainables.gns_adaln) against per-example gradients by explicit loops.

The reference takes every example's own float64 gradient of the modulation linears' parameters by autograd, one
example at a time, and forms the pair sums by loops (``analysis.core.gns_pairs``): on the collector directly (float64
model, unequal bins, bins with 0 and 1 example), and on the training step as it runs (float32, W = 1 with the halves
and with A = 2; W = 2 x A = 2 on a spawned gloo group). Training is bit-identical with the collection on and off.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from ddp_group import run_group

from analysis.core import metrics as M
from analysis.core.bins import bin_of
from trainables.config import TrialConfig
from trainables.data import load_dataset
from trainables.diffusion import NUM_TIMESTEPS, make_scheduler
from trainables.gns_adaln import AdaLNCollector, modulation_linears
from trainables.loop import DiTLearner
from trainables.presets import build_dit
from trainables.randomness import global_batch_indices, step_draws
from trainables.step import TrainStep
from trainables.trial import run_local

CPU, K, STEP = torch.device("cpu"), 4, 3


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_dit("tiny", sample_size=8, in_channels=1, num_classes=10).train()


def _loss64(model, sched, x, y, t, noise) -> torch.Tensor:
    """``per_example_loss`` without its cast of the prediction to float32: all float64."""
    pred = model(sched.add_noise(x, noise, t), timestep=t, class_labels=y).sample
    return (pred - noise).pow(2).flatten(1).mean(1)


def _per_example(ref, sched, x, y, t, noise) -> np.ndarray:
    """(n, P) float64: each example's own gradient of the modulation parameters, one autograd call per example."""
    params = [p for m in modulation_linears(ref) for p in (m.weight, m.bias)]
    rows = []
    for i in range(len(t)):
        loss = _loss64(ref, sched, x[i : i + 1], y[i : i + 1], t[i : i + 1], noise[i : i + 1])[0]
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]).numpy())
    return np.stack(rows)


def _sums(g: np.ndarray, t: torch.Tensor) -> np.ndarray:
    """The four sums by explicit loops over examples and pairs of one piece."""
    bins, out = bin_of(t.numpy(), K, NUM_TIMESTEPS), np.zeros((K + 1, 4))
    for i in range(len(g)):
        for row in (bins[i], K):
            out[row, 2:] += [g[i] @ g[i], 1]
        for j in range(len(g)):
            if i != j:
                out[K, :2] += [g[i] @ g[j], 1]
                if bins[i] == bins[j]:
                    out[bins[i], :2] += [g[i] @ g[j], 1]
    return out


def test_collector_equals_explicit_per_example_gradients_float64() -> None:
    model = _model().double()
    data, sched = load_dataset("digits", 297), make_scheduler()
    x, y = data.get(np.arange(9))
    x = x.double()
    t = torch.tensor([10, 20, 260, 600, 610, 620, 630, 30, 900])  # bins of 250: 3, 1 (no pair), 4 and 1 examples
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    col = AdaLNCollector(model, K, CPU)
    bins = torch.bucketize(t, torch.tensor([0, 250, 500, 750]), right=True) - 1
    col.begin(col.indicators(bins), 1.0 / (len(t) * 3))  # a loss mean / A with A = 3, say
    (_loss64(model, sched, x, y, t, noise).mean() / 3).backward()
    col.end_piece()
    acc, scale = col.pop_tensor()
    got = np.array(col.rows(acc.flatten().tolist(), scale))
    ref = _sums(_per_example(copy.deepcopy(model), sched, x, y, t, noise), t)
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    assert got[1, :2].tolist() == [0.0, 0.0] and got[1, 3] == 1  # one example: its |g|^2 counted, no pair
    assert not col.pop_tensor()[0].any()  # popped: the next step starts from zero
    col.remove()


def _reference(cfg: TrialConfig, pieces: list[slice]) -> np.ndarray:
    """Explicit float64 sums of the step over ``pieces`` (slices of the global batch: one per backward pass)."""
    data, sched = load_dataset("digits", 297), make_scheduler()
    ref = _model().double()
    idx = global_batch_indices(cfg.seed, STEP, cfg.batch_size, data.info.train_size)
    draws = step_draws(cfg.seed, STEP, cfg.batch_size, (1, 8, 8), NUM_TIMESTEPS)
    total = np.zeros((K + 1, 4))
    for sl in pieces:
        x, y = data.get(idx[sl])
        t, u, noise = (d[sl] for d in draws)
        y = torch.where(u < cfg.class_dropout, data.info.num_classes, y)
        total += _sums(_per_example(ref, sched, x.double(), y, t, noise.double()), t)
    return total


def _cfg(world: int, accum: int, micro: int) -> TrialConfig:
    return TrialConfig(
        preset="tiny",
        batch_size=micro * accum * world,
        micro_batch_size=micro,
        num_workers=world if world > 1 else 0,
        timestep_bins=K,
        gns_global_every=1,
    )


def _step(cfg: TrialConfig, rank: int, world: int, adaln: bool):
    data, sched = load_dataset("digits", 297), make_scheduler()
    model = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    col = AdaLNCollector(model, K, CPU) if adaln else None
    s = TrainStep(cfg, model, ddp, data, sched, rank, world, CPU, contextlib.nullcontext, adaln=col)(STEP)
    return s, [p.grad.clone() for p in model.parameters()]


def _close(got, ref: np.ndarray) -> None:
    got = np.asarray(got)
    scale = ref[:, 2:3]  # pair sums cancel: compare them on the scale of the squared norms (float32 model)
    np.testing.assert_allclose(got[:, [1, 3]], ref[:, [1, 3]])  # counts exactly
    np.testing.assert_allclose(got[:, [0, 2]], ref[:, [0, 2]], rtol=1e-4, atol=0)
    assert np.all(np.abs(got[:, 0] - ref[:, 0]) <= 1e-4 * scale[:, 0] + 1e-12)


@pytest.mark.parametrize(("accum", "micro"), [(1, 8), (2, 4)])
def test_step_sums_equal_explicit_float64_and_training_is_unchanged(accum: int, micro: int) -> None:
    cfg = _cfg(1, accum, micro)
    pieces = (
        [slice(0, micro // 2), slice(micro // 2, micro)]
        if accum == 1
        else [slice(m * micro, (m + 1) * micro) for m in range(accum)]
    )  # the halves of the lone micro-batch (gns_halves), or the micro-batches
    s, grads = _step(cfg, 0, 1, adaln=True)
    _close(s.adaln, _reference(cfg, pieces))
    off, grads_off = _step(cfg, 0, 1, adaln=False)
    assert off.adaln is None and off.loss == s.loss and off.g2_small == s.g2_small
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_off, strict=True))


def _worker(rank: int, world: int, init_method: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        cfg = _cfg(world, 2, 4)
        s, grads = _step(cfg, rank, world, adaln=True)
        off, grads_off = _step(cfg, rank, world, adaln=False)
        same = all(torch.equal(a, b) for a, b in zip(grads, grads_off, strict=True)) and off.loss == s.loss
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"adaln": s.adaln, "same": same}))
    finally:
        dist.destroy_process_group()


def test_ddp_two_ranks_all_reduce_the_sums(tmp_path) -> None:
    ranks = run_group(_worker, 2, tmp_path, 180.0)
    assert ranks[0]["adaln"] == ranks[1]["adaln"] and all(r["same"] for r in ranks)
    cfg = _cfg(2, 2, 4)  # rank r, micro-batch m holds positions 8 r + 4 m ..: the pieces of the global batch
    _close(ranks[0]["adaln"], _reference(cfg, [slice(4 * j, 4 * j + 4) for j in range(4)]))


def _params_after(cfg: TrialConfig, steps: int) -> list[torch.Tensor]:
    learner = DiTLearner(cfg, 0, 1, CPU)
    learner.start(0, 0.0)
    for step in range(steps):
        assert learner.step(step).finite
    learner.close()
    return [p.detach().clone() for p in learner.model.parameters()]


def test_parameters_bit_identical_on_and_off() -> None:
    cfg = TrialConfig(preset="tiny", batch_size=16, micro_batch_size=8, timestep_bins=K, gns_every=2, max_steps=4)
    on = _params_after(cfg, 4)
    off = _params_after(cfg.replace(gns_adaln=False), 4)
    assert all(torch.equal(a, b) for a, b in zip(on, off, strict=True))


def test_trial_reports_adaln_metrics_and_compile_turns_it_off() -> None:
    cfg = TrialConfig(
        preset="tiny", batch_size=16, micro_batch_size=8, timestep_bins=K, gns_every=0, max_steps=4, eval_every=4
    )
    s = run_local(cfg)
    names = {r[2] for rep in s.reports for r in rep["rows"]}
    assert {M.GNS_ADALN_B_SIMPLE, M.GNS_ADALN_B_SIMPLE_SE, M.GNS_ADALN_MEASUREMENTS} <= names
    assert M.per_bin(M.GNS_ADALN_BIN_MEASUREMENTS, 0) in names and s.summary["gns_adaln"] == "on"
    learner = DiTLearner(cfg.replace(compile=True), 0, 1, CPU)  # compiles lazily: no compile happens here
    assert learner.adaln is None and learner.train_step.adaln is None
    learner.close()
