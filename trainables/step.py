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

Inputs come from `trainables.data.pipeline.MicroBatches` (gathered ahead, copied non-blocking); timesteps, noise
and label drops from `trainables.randomness.step_draws` on the device (three calls per step, sliced per
micro-batch). Everything stays on the device until one read of a small stats tensor at the end of the step: the
step's only host synchronisation.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from trainables.data.pipeline import MicroBatches
from trainables.diffusion import NUM_TIMESTEPS, per_example_loss
from trainables.gns_stats import sq_norm
from trainables.randomness import local_slice, step_draws


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
        self.rank, self.world, self.device, self.autocast = rank, world_size, torch.device(device), autocast
        self.hook = hook  # LocalGradNormHook on the DDP model (W >= 2 with GNS on)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.first_micro = cfg.gns and world_size == 1 and cfg.accum >= 2
        self.batches = MicroBatches(
            data, cfg.seed, cfg.batch_size, world_size, rank, cfg.accum, cfg.micro_batch_size, self.device,
            depth=getattr(cfg, "prefetch", 0),
        )  # fmt: skip
        self.generator = torch.Generator(device=self.device)
        info = data.info
        self.shape = (info.channels, info.image_size, info.image_size)

    def draws(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The global batch's ``(timesteps [B], uniforms [B], noise [B, C, H, W])`` of ``step`` on the device."""
        return step_draws(self.cfg.seed, step, self.cfg.batch_size, self.shape, NUM_TIMESTEPS, self.device,
                          self.generator)  # fmt: skip

    def _micro_batch(self, step: int, draws, m: int):
        cfg = self.cfg
        sl = local_slice(cfg.batch_size, self.world, self.rank, cfg.accum, cfg.micro_batch_size, m)
        x, y = self.batches.get(step, m)  # (micro, C, H, W) float32, (micro,) on the device
        t, u, noise = (d[sl] for d in draws)
        y = torch.where(u < cfg.class_dropout, self.data.info.num_classes, y)  # label drop -> null class
        return x, y, t, noise

    def close(self) -> None:
        """Stop the prefetching thread."""
        self.batches.close()

    def __call__(self, step: int) -> StepStats:
        cfg, A = self.cfg, self.cfg.accum
        draws = self.draws(step)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        micro_g2 = torch.zeros((), dtype=torch.float64, device=self.device)
        for m in range(A):
            x, y, t, noise = self._micro_batch(step, draws, m)
            last = m == A - 1
            sync = contextlib.nullcontext() if (last or self.world == 1) else self.ddp.no_sync()
            with sync:
                with self.autocast():
                    losses = per_example_loss(self.ddp, self.scheduler, x, y, t, noise)  # (micro,)
                (losses.mean() / A).backward()  # mean over the effective batch after DDP's average over W
            loss_sum += losses.detach().double().sum()
            if self.first_micro and m == 0:
                micro_g2 = sq_norm([p.grad for p in self.params]) * A**2  # gradient of its *mean* loss (loss / A)
        g2_big = sq_norm([p.grad for p in self.params]).to(self.device)
        if self.hook is not None:
            local_g2 = self.hook.pop_tensor().to(device=self.device, dtype=torch.float64)
        else:
            local_g2 = torch.zeros((), dtype=torch.float64, device=self.device)
        reduced = torch.stack([loss_sum, local_g2])
        if self.world > 1:
            torch.distributed.all_reduce(reduced)
        # the step's one host synchronisation: [loss sum, |G_B|^2, first micro |G|^2, sum of local |G|^2]
        loss_total, g2_big_f, micro_g2_f, local_sum = torch.stack([reduced[0], g2_big, micro_g2, reduced[1]]).tolist()
        loss = loss_total / cfg.batch_size
        micro = cfg.micro_batch_size
        if not cfg.gns or not global_gns_available(self.world, A):
            g2_small, b_small = None, None
        elif self.world > 1:
            g2_small, b_small = local_sum / self.world, micro * A
        else:
            g2_small, b_small = micro_g2_f, micro
        finite = math.isfinite(loss) and math.isfinite(g2_big_f)
        return StepStats(loss, g2_big_f, g2_small, b_small, cfg.batch_size, finite)
