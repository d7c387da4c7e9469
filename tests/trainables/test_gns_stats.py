"""The collected squared norms equal explicitly computed ones (float64, rel. error <= 1e-6).

``LocalGradNormHook`` runs inside DDP on a real gloo process group (``W`` spawned processes on
localhost): its per-rank number must be ``|g_local|^2`` of that rank's accumulated gradient, and the
gradient DDP leaves in ``.grad`` must still be the mean of the local ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from ddp_group import run_group
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainables.gns_stats import LocalGradNormHook, sq_norm

# --------------------------------------------------------------------------------------------------------
# sq_norm
# --------------------------------------------------------------------------------------------------------


def test_sq_norm_brute_force_float64() -> None:
    gen = torch.Generator().manual_seed(0)
    ts = [torch.randn(shape, generator=gen) for shape in [(3,), (4, 5), (2, 3, 4), ()]]
    ts.append(torch.randn(7, generator=gen, dtype=torch.float64))
    ts.append(torch.randn(6, generator=gen).to(torch.bfloat16))
    out = sq_norm([*ts, None])  # None (no gradient) is skipped
    ref = sum(float((t.double() ** 2).sum()) for t in ts)
    assert out.dtype == torch.float64 and out.ndim == 0
    assert float(out) == pytest.approx(ref, rel=1e-12)


def test_sq_norm_empty_is_zero() -> None:
    out = sq_norm([])
    assert out.dtype == torch.float64 and float(out) == 0.0


def test_sq_norm_large_float32_tensor() -> None:
    """A million float32 values, compared with an explicit float64 sum of squares."""
    t = torch.randn(1_000_000, generator=torch.Generator().manual_seed(1))
    ref = float(np.sum(t.numpy().astype(np.float64) ** 2))
    assert float(sq_norm([t, t[:10]])) == pytest.approx(ref + float((t[:10].double() ** 2).sum()), rel=1e-10)


# --------------------------------------------------------------------------------------------------------
# LocalGradNormHook under DDP (gloo, W spawned processes)
# --------------------------------------------------------------------------------------------------------

MICRO = 4  # examples per micro-batch


def _model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])


def _worker(rank: int, world: int, init_method: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        results = []
        ref_model = _model().double()  # float64 reference copy of the same weights
        ddp = DistributedDataParallel(_model(), bucket_cap_mb=1e-4)  # tiny buckets: several per step
        hook = LocalGradNormHook().register(ddp)
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
        for accum in (1, 2, 2):  # the last repeats after DDP's bucket rebuild
            xs = [torch.randn(MICRO, 8, generator=gen) for _ in range(accum)]
            ys = [torch.randn(MICRO, 4, generator=gen) for _ in range(accum)]
            ddp.zero_grad(set_to_none=True)
            ref_model.zero_grad(set_to_none=True)
            buckets_in_no_sync = 0
            for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
                if i < accum - 1:
                    with ddp.no_sync():  # forward and backward inside: no all-reduce, no hook
                        (nn.functional.mse_loss(ddp(x), y) / accum).backward()
                    buckets_in_no_sync += hook.buckets
                else:
                    (nn.functional.mse_loss(ddp(x), y) / accum).backward()
                (nn.functional.mse_loss(ref_model(x.double()), y.double()) / accum).backward()
            buckets = hook.buckets
            local_sq = hook.pop()

            local = _flat_grad(ref_model)  # float64 local gradient of this rank
            gathered = [torch.empty_like(local) for _ in range(world)]
            dist.all_gather(gathered, local)
            mean = torch.stack(gathered).mean(dim=0)
            averaged = _flat_grad(ddp.module)
            results.append(
                {
                    "accum": accum,
                    "hook": local_sq,
                    "ref": float(local @ local),
                    "avg_rel_err": float((averaged - mean).norm() / mean.norm()),
                    "buckets": buckets,
                    "buckets_in_no_sync": buckets_in_no_sync,
                }
            )
        try:
            hook.pop()
            popped_twice = True
        except RuntimeError:
            popped_twice = False
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"steps": results, "pop2": popped_twice}))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2])
def test_local_grad_norm_hook_matches_explicit_gradients(world: int, tmp_path: Path) -> None:
    # W = 1 is spawned too: in the test process, freeing DDP's reducer after destroy_process_group() joined a gloo
    # thread forever now and then (~3 s of spawn buys a reliable suite); a spawned rank leaves with os._exit
    ranks = run_group(_worker, world, tmp_path, timeout_s=90.0)
    for r in ranks:
        assert r["pop2"] is False  # pop() resets: a second pop without a backward raises
        for step in r["steps"]:
            assert step["buckets_in_no_sync"] == 0  # nothing collected on non-syncing micro-steps
            assert step["hook"] == pytest.approx(step["ref"], rel=1e-6)
            assert step["avg_rel_err"] < 1e-6  # training still sees the all-reduced mean
        # tiny bucket_cap_mb: some synchronising step reduces several buckets, so the per-bucket sum is exercised
        # (how many, and on which step DDP rebuilds its buckets, is DDP's business, not asserted)
        assert max(s["buckets"] for s in r["steps"]) > 1
    if world == 2:  # the two ranks really saw different data
        assert not np.isclose(ranks[0]["steps"][0]["ref"], ranks[1]["steps"][0]["ref"])


def test_register_rejects_plain_module() -> None:
    with pytest.raises(TypeError, match="^expected a DistributedDataParallel model, got Linear$"):
        LocalGradNormHook().register(nn.Linear(2, 2))  # type: ignore[arg-type]


def test_pop_before_any_bucket_names_the_fix() -> None:
    hook = LocalGradNormHook()
    with pytest.raises(RuntimeError, match=r"^no gradient bucket was all-reduced since the last pop\(\): call it"):
        hook.pop()
    with pytest.raises(RuntimeError, match=r"the backward of a synchronising micro-step \(outside no_sync\(\)\)$"):
        hook.pop_tensor()


def _bucket_worker(rank: int, world: int, init_method: str, out_dir: str) -> None:
    """The checks of `test_hook_counts_each_bucket_once_in_float64` on a one-rank group (a failed assert exits the
    spawned rank non-zero, which fails the test); ``rank0.json`` says how many steps were checked."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        ddp = DistributedDataParallel(_model(), bucket_cap_mb=1e-4)  # tiny buckets: several per backward
        hook = LocalGradNormHook()
        calls = []

        def counting(state, bucket):  # no annotations: DDP checks them at runtime (this file has string annotations)
            calls.append(bucket.index())
            return LocalGradNormHook._hook(state, bucket)

        ddp.register_comm_hook(state=hook, hook=counting)
        gen = torch.Generator().manual_seed(3)
        for _ in range(2):  # the second backward runs after DDP's bucket rebuild
            x, y = torch.randn(MICRO, 8, generator=gen), torch.randn(MICRO, 4, generator=gen)
            ddp.zero_grad(set_to_none=True)
            with ddp.no_sync():
                nn.functional.mse_loss(ddp(x), y).backward()
            assert hook.buckets == 0 and not calls
            ddp.zero_grad(set_to_none=True)
            nn.functional.mse_loss(ddp(x), y).backward()
            assert len(calls) >= 1 and hook.buckets == len(calls)
            value = hook.pop_tensor()
            assert value.dtype == torch.float64 and value.ndim == 0
            grads = [p.grad.double() for p in ddp.module.parameters()]  # W = 1: the average is the local gradient
            assert float(value) == pytest.approx(float(sum((g**2).sum() for g in grads)), rel=1e-6)
            assert hook.buckets == 0
            calls.clear()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"checked_steps": 2}))
    finally:
        dist.destroy_process_group()


def test_hook_counts_each_bucket_once_in_float64(tmp_path: Path) -> None:
    """One synchronising backward on a one-rank gloo group: ``buckets`` equals the number of times DDP called the
    comm hook (counted by a wrapping hook, so DDP's bucketing is not assumed), the accumulated norm is a float64
    tensor equal to the float64 ``|grad|^2``, and ``pop`` resets both; a ``no_sync`` backward adds nothing."""
    assert run_group(_bucket_worker, 1, tmp_path, timeout_s=90.0) == [{"checked_steps": 2}]
