"""Global GNS collection inside the trial (McCandlish et al. 2018, App. A.1), checked against explicit gradients.

``TrainStep`` (float32, as trained) reports ``|G_b|^2`` and ``|G_B|^2``; the reference recomputes every micro-batch
gradient explicitly with the model cast to float64, from the same split-invariant draws, and forms the small and
big batches by hand: ``W >= 2`` -> small = each rank's accumulated gradient, big = their mean; ``W = 1, A >= 2`` ->
small = every micro-batch gradient (mean squared norm), big = the accumulated one; ``W = A = 1`` -> the two halves
of the micro-batch (``gns_halves``; without it: unavailable). W=2: spawned gloo.
Also: GNS on vs off (global and per bin) leaves the training losses bit-identical.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from ddp_group import run_group

from analysis.core import metrics as M
from trainables.config import TrialConfig
from trainables.data import load_dataset
from trainables.diffusion import NUM_TIMESTEPS, make_scheduler, per_example_loss
from trainables.gns_bins import BinGNS
from trainables.gns_stats import LocalGradNormHook
from trainables.loop import GNS_UNAVAILABLE
from trainables.presets import build_dit
from trainables.randomness import global_batch_indices, local_slice, step_draws
from trainables.step import TrainStep
from trainables.trial import run_local

MICRO, STEP = 4, 3
CPU = torch.device("cpu")


def _cfg(world: int, accum: int, **kw) -> TrialConfig:
    return TrialConfig(
        preset="tiny",
        batch_size=MICRO * accum * world,
        micro_batch_size=MICRO,
        num_workers=world if world > 1 else 0,
        timestep_bins=4,
        gns_global_every=1,  # A = 1: the halves at every step (the reference cadence)
        **kw,
    )


def _explicit_local_grads(cfg: TrialConfig, ref, data, sched, rank: int, world: int) -> list[torch.Tensor]:
    """Flat float64 gradient of each of this rank's micro-batch mean losses, recomputed by hand."""
    idx = global_batch_indices(cfg.seed, STEP, cfg.batch_size, data.info.train_size)
    params = list(ref.parameters())
    out = []
    draws = step_draws(cfg.seed, STEP, cfg.batch_size, (1, 8, 8), NUM_TIMESTEPS)  # the whole global batch's
    for m in range(cfg.accum):
        sl = local_slice(cfg.batch_size, world, rank, cfg.accum, MICRO, m)
        x, y = data.get(idx[sl])
        t, u, noise = (d[sl] for d in draws)
        y = torch.where(u < cfg.class_dropout, data.info.num_classes, y)
        loss = per_example_loss(ref, sched, x.double(), y, t, noise.double()).mean()
        out.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    return out


def _explicit_halves(cfg: TrialConfig, ref, data, sched) -> list[torch.Tensor]:
    """W = A = 1: flat float64 gradients of the two halves' mean losses (MICRO even: equal halves)."""
    idx = global_batch_indices(cfg.seed, STEP, cfg.batch_size, data.info.train_size)
    draws = step_draws(cfg.seed, STEP, cfg.batch_size, (1, 8, 8), NUM_TIMESTEPS)
    out = []
    for sl in (slice(0, MICRO // 2), slice(MICRO // 2, MICRO)):
        x, y = data.get(idx[sl])
        t, u, noise = (d[sl] for d in draws)
        y = torch.where(u < cfg.class_dropout, data.info.num_classes, y)
        loss = per_example_loss(ref, sched, x.double(), y, t, noise.double()).mean()
        out.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(ref.parameters()))]))
    return out


def _collect(rank: int, world: int, out_dir: str) -> None:
    """Per accumulation A: the collected norms and the explicit float64 reference; and a W-rank BinGNS pass."""
    data, sched = load_dataset("digits", 297), make_scheduler()
    results = {}
    for accum in (1, 2):
        cfg = _cfg(world, accum)
        torch.manual_seed(0)
        model = build_dit("tiny", sample_size=8, in_channels=1, num_classes=10).train()
        ref = copy.deepcopy(model).double()
        ddp, hook = model, None
        if world > 1:
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            hook = LocalGradNormHook().register(ddp)
        stats = TrainStep(cfg, model, ddp, data, sched, rank, world, CPU, contextlib.nullcontext, hook)(STEP)
        micro = _explicit_local_grads(cfg, ref, data, sched, rank, world)
        local = torch.stack(micro).mean(0)  # this rank's accumulated gradient (mean loss over its examples)
        gathered = [torch.empty_like(local) for _ in range(world)]
        if world > 1:
            dist.all_gather(gathered, local)
        else:
            gathered = [local]
        big = torch.stack(gathered).mean(0)
        if world > 1:
            ref_small, ref_b = float(torch.stack([g @ g for g in gathered]).mean()), MICRO * accum
        elif accum > 1:
            ref_small, ref_b = float(torch.stack([g @ g for g in micro]).mean()), MICRO  # every micro-batch's
        else:  # the two halves of the micro-batch (gns_halves)
            ref_small, ref_b = float(torch.stack([g @ g for g in _explicit_halves(cfg, ref, data, sched)]).mean()), 2
        results[accum] = {
            "g2_small": stats.g2_small,
            "b_small": stats.b_small,
            "g2_big": stats.g2_big,
            "b_big": stats.b_big,
            "ref_small": ref_small,
            "ref_b": ref_b,
            "ref_big": float(big @ big),
            "ref_B": cfg.batch_size,
        }
    torch.manual_seed(0)
    model = build_dit("tiny", sample_size=8, in_channels=1, num_classes=10).train()
    cfg = _cfg(world, 1, gns_every=1, gns_bin_examples=4)
    bins = BinGNS(cfg, model, data, sched, rank, world, CPU, contextlib.nullcontext).measure(7)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"steps": results, "bins": bins}))


def _worker(rank: int, world: int, init_method: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        _collect(rank, world, out_dir)
    finally:
        dist.destroy_process_group()


def _run(world: int, out_dir: Path, timeout_s: float = 120.0) -> list[dict]:
    if world == 1:
        _collect(0, 1, str(out_dir))
        return [json.loads(Path(out_dir, "rank0.json").read_text())]
    return run_group(_worker, world, out_dir, timeout_s)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> list[dict]:
    return _run(1, tmp_path_factory.mktemp("w1"))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    return _run(2, tmp_path_factory.mktemp("w2"))


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("accum", [1, 2])
def test_collected_norms_equal_explicit_float64(world: int, accum: int, request) -> None:
    one_rank = request.getfixturevalue("one_rank")
    ranks = one_rank if world == 1 else request.getfixturevalue("two_ranks")
    for r in ranks:
        s = r["steps"][str(accum)]
        assert s["b_big"] == s["ref_B"] == MICRO * accum * world
        assert s["g2_big"] == pytest.approx(s["ref_big"], rel=1e-6)
        assert s["b_small"] == s["ref_b"]
        assert s["g2_small"] == pytest.approx(s["ref_small"], rel=1e-6)
        assert s["g2_small"] > s["g2_big"]  # smaller batches are noisier (a sanity check on which is which)
    if world == 2:  # both ranks report the same global numbers, and the W=2 BinGNS pass equals the W=1 pass
        assert ranks[0]["steps"] == ranks[1]["steps"]
        assert ranks[0]["bins"] == ranks[1]["bins"]
        for name, value in one_rank[0]["bins"].items():
            assert ranks[0]["bins"][name] == pytest.approx(value, rel=1e-6), name


TINY = dict(preset="tiny", eval_every=3, eval_repeats=1, max_steps=6, timestep_bins=4)


def _losses(session, name: str = M.TRAIN_LOSS) -> list[tuple[int, float]]:
    return [(r[0], r[3]) for rep in session.reports for r in rep["rows"] if r[2] == name]


def test_w1_a1_says_global_gns_unavailable(capsys) -> None:
    cfg = dict(TINY, max_steps=2, batch_size=8, micro_batch_size=8, gns=True, gns_halves=False, gns_every=0)
    s = run_local(TrialConfig(**cfg))
    assert s.summary["gns_global"] == GNS_UNAVAILABLE  # `bcrit train` prints it; a sweep says it once, not per trial
    assert GNS_UNAVAILABLE not in capsys.readouterr().out
    # only the adaLN-gradient GNS, which needs no second batch size (trainables.gns_adaln)
    assert not [r for rep in s.reports for r in rep["rows"] if r[2].startswith("gns/") and "/adaln/" not in r[2]]
    assert s.summary["gns_adaln"] == "on"


def test_global_gns_on_off_identical_losses() -> None:
    # W=1, A=2: micro-batch gradients kept apart, measured at every step (auto: every 4th)
    base = dict(TINY, batch_size=16, micro_batch_size=8, gns_every=0, gns_global_every=1)
    on = run_local(TrialConfig(**base, gns=True))
    off = run_local(TrialConfig(**base, gns=False))
    assert _losses(on) == _losses(off) and len(_losses(on)) == 6
    assert _losses(on, M.EVAL_LOSS) == _losses(off, M.EVAL_LOSS)
    # B_simple needs >= 2 measurements in its window (analysis.core.gns.GNSWindow), which never reaches back past half
    # the steps so far (gns_window_half): logged from step 3 on (steps 2..3); without the half rule from step 2
    assert [s for s, _ in _losses(on, M.GNS_B_SIMPLE)] == [3, 4, 5, 6] and not _losses(off, M.GNS_B_SIMPLE)
    plain = run_local(TrialConfig(**base, gns=True, gns_window_half=False))
    assert [s for s, _ in _losses(plain, M.GNS_B_SIMPLE)] == [2, 3, 4, 5, 6] and _losses(plain) == _losses(on)
    assert len(_losses(on, M.GNS_G2_SMALL)) == 6  # the raw statistics of every step are logged


def test_per_bin_gns_on_off_identical_losses() -> None:
    base = dict(TINY, batch_size=8, micro_batch_size=8, gns=False)
    on = run_local(TrialConfig(**base, gns_every=2, gns_bin_examples=4))
    off = run_local(TrialConfig(**base, gns_every=0))
    assert _losses(on) == _losses(off) and len(_losses(on)) == 6
    assert _losses(on, M.EVAL_LOSS) == _losses(off, M.EVAL_LOSS)
    for k in range(4):
        # >= 2 measurements (per-bin windows keep the plain gns_window rule: gns_window_half is global only)
        assert [s for s, _ in _losses(on, M.per_bin(M.GNS_BIN_B_SIMPLE, k))] == [4, 6]
        assert not _losses(off, M.per_bin(M.GNS_BIN_B_SIMPLE, k))
