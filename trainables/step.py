"""One optimizer step: gradient accumulation over micro-batches, DDP sync on the last micro-step only, and the
gradient norms that global GNS needs, collected from gradients the step computes anyway.

Global GNS (McCandlish et al. 2018, App. A.1) needs the squared norm of a "small" and a "big" batch gradient,
both of mean losses, at the same parameters:
- ``W >= 2``: small = each rank's accumulated local gradient (``b = micro * A``), read in a DDP communication
  hook just before the all-reduce; big = the all-reduced gradient (``B = b * W``).
- ``W = 1, A >= 2``: small = the first micro-batch's gradient (``b = micro``), which is what ``.grad`` holds after
  the first micro-step (one extra norm per step; no copy, no extra memory); big = the accumulated gradient
  (``B = micro * A``). Both are unbiased (App. A.1 holds for any two batch sizes of iid examples).
- ``W = A = 1``: no second batch size exists in the step, so online global GNS is unavailable.
Norms are taken in float32 gradients accumulated in float64, after unscaling (bf16 needs no scaler), before clipping.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from trainables.diffusion import NUM_TIMESTEPS, per_example_loss
from trainables.gns_stats import sq_norm
from trainables.randomness import STREAM_EXAMPLE, example_draws, global_batch_indices, local_slice


@dataclass
class StepStats:
    loss: float  # mean per-example loss over the global batch
    g2_big: float  # |G_B|^2 (all-reduced gradient)
    g2_small: float | None  # mean |G_b|^2 over the small batches, None when unavailable
    b_small: int | None
    b_big: int
    finite: bool


def global_gns_available(world_size: int, accum: int) -> bool:
    return world_size * accum >= 2


class TrainStep:
    def __init__(self, cfg, model, ddp_model, data, scheduler, rank, world_size, device, autocast, hook=None):
        self.cfg, self.model, self.ddp = cfg, model, ddp_model
        self.data, self.scheduler = data, scheduler
        self.rank, self.world, self.device, self.autocast = rank, world_size, device, autocast
        self.hook = hook  # LocalGradNormHook on the DDP model (W >= 2 with GNS on)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.first_micro = cfg.gns and world_size == 1 and cfg.accum >= 2

    def _micro_batch(self, step: int, idx, m: int):
        cfg = self.cfg
        sl = local_slice(cfg.batch_size, self.world, self.rank, cfg.accum, cfg.micro_batch_size, m)
        x, y = self.data.get(idx[sl])  # (micro, C, H, W), (micro,)
        t, u, noise = example_draws(
            cfg.seed, STREAM_EXAMPLE, step, range(sl.start, sl.stop), x.shape[1:], NUM_TIMESTEPS
        )
        y = torch.where(u < cfg.class_dropout, self.data.info.num_classes, y)  # label drop -> null class
        to = self.device
        return x.to(to), y.to(to), t.to(to), noise.to(to)

    def __call__(self, step: int) -> StepStats:
        cfg, A = self.cfg, self.cfg.accum
        idx = global_batch_indices(cfg.seed, step, cfg.batch_size, self.data.info.train_size)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        micro_g2 = torch.zeros((), dtype=torch.float64, device=self.device)
        for m in range(A):
            x, y, t, noise = self._micro_batch(step, idx, m)
            last = m == A - 1
            sync = contextlib.nullcontext() if (last or self.world == 1) else self.ddp.no_sync()
            with sync:
                with self.autocast():
                    losses = per_example_loss(self.ddp, self.scheduler, x, y, t, noise)  # (micro,)
                (losses.mean() / A).backward()  # mean over the effective batch after DDP's average over W
            loss_sum += losses.detach().double().sum()
            if self.first_micro and m == 0:
                micro_g2 = sq_norm([p.grad for p in self.params]) * A**2  # gradient of its *mean* loss (loss / A)
        g2_big = sq_norm([p.grad for p in self.params])
        local_g2 = torch.tensor(self.hook.pop() if self.hook else 0.0, dtype=torch.float64, device=self.device)
        stats = torch.stack([loss_sum, local_g2])
        if self.world > 1:
            torch.distributed.all_reduce(stats)
        loss = stats[0].item() / cfg.batch_size
        g2_big_f = g2_big.item()
        micro = cfg.micro_batch_size
        if not cfg.gns or not global_gns_available(self.world, A):
            g2_small, b_small = None, None
        elif self.world > 1:
            g2_small, b_small = stats[1].item() / self.world, micro * A
        else:
            g2_small, b_small = micro_g2.item(), micro
        finite = bool(torch.isfinite(torch.tensor([loss, g2_big_f])).all())
        return StepStats(loss, g2_big_f, g2_small, b_small, cfg.batch_size, finite)
