"""One optimizer step: gradient accumulation over micro-batches, DDP sync on the last micro-step only, and the
gradient norms that global GNS needs, collected from gradients the step computes anyway.

Global GNS needs the squared norms of a "small" and a "big" batch gradient of mean losses at the same parameters
(`trainables.config.global_gns_mode` names the cases):
- ``W >= 2`` ("ranks"): small = each rank's accumulated gradient (``b = micro * A``), read in a DDP communication
  hook before the all-reduce; big = the all-reduced gradient (``B = b * W``).
- ``W = 1, A >= 2`` ("micro-batches"): small = every micro-batch's gradient (``b = micro``;
  `trainables.gns_stats.PieceNorms`), big = the accumulated one (``B = micro * A``).
- ``W = A = 1`` with ``gns_halves`` ("halves"): two backward passes over the micro-batch's halves (the update equals
  the one-backward one up to float rounding); small = the halves' (size-weighted, ``b = micro / 2``); else no GNS.
``halves`` and ``micro-batches`` measure every ``gns_global_every``-th step only, the other steps run as with GNS off.
With ``gns_adaln`` every backward pass also feeds `trainables.gns_adaln.AdaLNCollector` (per-example gradients of the
modulation linears, read by hooks), whose per-bin sums join the step's all-reduce and host read.
Norms: float32 gradients accumulated in float64, after unscaling, before clipping. One read of a small stats tensor
at the end is the step's only host synchronisation (inputs and draws stay on the device)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from analysis.core.bins import timestep_bins
from trainables.config import GNS_HALVES, GNS_MICRO, GNS_NONE, GNS_OFF, GNS_RANKS, measures_global
from trainables.data.pipeline import MicroBatches
from trainables.diffusion import NUM_TIMESTEPS, per_example_loss
from trainables.gns_stats import PieceNorms, sq_norm
from trainables.randomness import local_slice, step_draws


@dataclass
class StepStats:
    loss: float  # mean per-example loss over the global batch
    g2_big: float  # |G_B|^2 (all-reduced gradient)
    g2_small: float | None  # mean |G_b|^2 over the small batches, None when unavailable
    b_small: float | None  # examples per small batch (micro / 2 for the halves of an odd micro-batch)
    b_big: int
    finite: bool
    adaln: list[list[float]] | None = None  # adaLN-gradient GNS sums, (K + 1) rows of 4 (analysis.core.gns_pairs)


def global_gns_available(cfg) -> bool:
    """Whether the trial measures global GNS (``cfg.global_gns`` is neither "off" nor "unavailable")."""
    return cfg.global_gns not in (GNS_OFF, GNS_NONE)


class TrainStep:
    def __init__(
        self,
        cfg,
        model,
        ddp_model,
        data,
        scheduler,
        rank,
        world_size,
        device,
        autocast,
        hook=None,
        sampler=None,
        adaln=None,
    ):
        self.cfg, self.model, self.ddp = cfg, model, ddp_model
        self.data, self.scheduler = data, scheduler
        self.rank, self.world, self.device, self.autocast = rank, world_size, torch.device(device), autocast
        self.hook = hook  # LocalGradNormHook on the DDP model (W >= 2 with GNS on)
        self.params = [p for p in model.parameters() if p.requires_grad]
        # a batch-size schedule (analysis.core.stages) changes A per stage, and with it where small batches come from
        # (and how often they are measured: global_gns_every)
        self.stages = cfg.stages
        self.modes, self.every = (list(x) for x in zip(*cfg.global_gns_stages, strict=True))
        self.mode = self.modes[0]
        self.pieces = PieceNorms(self.params, cfg.batch_size) if {GNS_MICRO, GNS_HALVES} & set(self.modes) else None
        self.batches = MicroBatches(
            data, cfg.seed, cfg.batch_size, world_size, rank, cfg.accum, cfg.micro_batch_size, self.device,
            depth=getattr(cfg, "prefetch", 0), stages=self.stages,
        )  # fmt: skip
        self.generator = torch.Generator(device=self.device)
        info = data.info
        self.shape = (info.channels, info.image_size, info.image_size)
        self.sampler = sampler  # trainables.timestep_sampler.TimestepSampler; None = uniform (the original draws)
        self.adaln = adaln  # trainables.gns_adaln.AdaLNCollector (config gns_adaln), or None
        if adaln is not None:
            lows = [lo for lo, _ in timestep_bins(adaln.num_bins, NUM_TIMESTEPS)]
            self._bin_lows = torch.tensor(lows, dtype=torch.int64, device=self.device)

    def draws(self, step: int) -> tuple[torch.Tensor, ...]:
        """The global batch's ``(timesteps [B], uniforms [B], noise [B, C, H, W])`` of ``step`` on the device (``B``
        of the step's stage: still keyed by ``(seed, step)``); with a timestep sampler the timesteps are re-drawn from
        its allocation, and ``(weights [B], bins [B])`` follow."""
        B = self.stages.batch(step)
        t, u, noise = step_draws(self.cfg.seed, step, B, self.shape, NUM_TIMESTEPS, self.device, self.generator)
        if self.sampler is None:
            return t, u, noise
        t, w, k = self.sampler.draw(self.generator, B)  # same generator, after the noise
        return t, u, noise, w, k

    def _micro_batch(self, step: int, draws, m: int, B: int, A: int):
        cfg = self.cfg
        sl = local_slice(B, self.world, self.rank, A, cfg.micro_batch_size, m)
        x, y = self.batches.get(step, m)  # (micro, C, H, W) float32, (micro,) on the device
        t, u, noise, *wk = (d[sl] for d in draws)  # wk: [weights, bins] of a non-uniform sampler
        y = torch.where(u < cfg.class_dropout, self.data.info.num_classes, y)  # label drop -> null class
        return x, y, t, noise, wk

    def close(self) -> None:
        """Stop the prefetching thread."""
        self.batches.close()

    def _backward(
        self,
        x,
        y,
        t,
        noise,
        m: int,
        A: int,
        mode: str,
        loss_sum: torch.Tensor,
        wk=(),
        bin_stats=None,
        adaln_groups=None,
    ):
        """Micro-batch ``m`` of ``A``: its forward and backward, one pass or (``halves``, A = 1) one per half.
        ``wk``: ``[weights, bins]`` of a non-uniform sampler (each loss is weighted; ``bin_stats`` collects per-bin
        L^2)."""
        micro, halves = self.cfg.micro_batch_size, mode == GNS_HALVES
        pieces = self.pieces if mode in (GNS_MICRO, GNS_HALVES) else None
        cuts = [(0, micro // 2), (micro // 2, micro)] if halves else [(0, micro)]
        for i, (lo, hi) in enumerate(cuts):
            if self.adaln is not None:  # the backward loss below is scale x the sum of the per-example losses
                self.adaln.begin(adaln_groups[lo:hi], 1.0 / micro if halves else 1.0 / ((hi - lo) * A))
            with self.autocast():
                losses = per_example_loss(self.ddp, self.scheduler, x[lo:hi], y[lo:hi], t[lo:hi], noise[lo:hi])
            if wk:  # importance weights q_k / p_k: an unbiased estimate of the uniform objective
                self.sampler.bin_stats(losses, wk[1][lo:hi], bin_stats)
                losses = losses * wk[0][lo:hi]
            if halves:  # each half's share of the micro-batch mean
                (losses.sum() / micro).backward()
            else:
                (losses.mean() / A).backward()  # mean over the effective batch after DDP's average over W
            loss_sum += losses.detach().double().sum()
            if self.adaln is not None:
                self.adaln.end_piece()
            if pieces is not None:
                pieces.after_piece(hi - lo, last=m == A - 1 and i == len(cuts) - 1)

    def step_mode(self, step: int) -> str:
        """The global GNS mode 0-based ``step`` runs: its stage's, or ``unavailable`` (one backward per micro-batch,
        no norms: exactly the step of global GNS off) where the stage's cadence skips it (`measures_global`)."""
        stage = self.stages.index(step)
        mode = self.modes[stage]
        return mode if mode in (GNS_OFF, GNS_RANKS) or measures_global(step, self.every[stage]) else GNS_NONE

    def __call__(self, step: int) -> StepStats:
        cfg, B = self.cfg, self.stages.batch(step)
        A, mode = B // (cfg.micro_batch_size * self.world), self.step_mode(step)
        draws = self.draws(step)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        if self.pieces is not None:
            self.pieces.total = B
        nbins = self.sampler.num_bins if self.sampler is not None else 0
        bin_stats = torch.zeros(nbins, 2, dtype=torch.float64, device=self.device)  # per bin [sum L^2, count]
        indicators, micro = None, cfg.micro_batch_size
        if self.adaln is not None:  # each example's timestep bin (analysis.core.bins), as indicators, once a step
            indicators = self.adaln.indicators(torch.bucketize(draws[0], self._bin_lows, right=True) - 1)
        for m in range(A):
            x, y, t, noise, wk = self._micro_batch(step, draws, m, B, A)
            last = m == A - 1
            sync = contextlib.nullcontext() if (last or self.world == 1) else self.ddp.no_sync()
            with sync:
                groups = None if indicators is None else indicators[local_slice(B, self.world, self.rank, A, micro, m)]
                self._backward(x, y, t, noise, m, A, mode, loss_sum, wk, bin_stats, groups)
        g2_big = sq_norm([p.grad for p in self.params]).to(self.device)
        small, k = torch.zeros((), dtype=torch.float64, device=self.device), 0
        pieces = self.pieces is not None and mode in (GNS_MICRO, GNS_HALVES)
        if pieces:
            small, k = self.pieces.pop_tensor()
            small = small.to(self.device)
        if self.hook is not None:
            local_g2 = self.hook.pop_tensor().to(device=self.device, dtype=torch.float64)
        else:
            local_g2 = torch.zeros((), dtype=torch.float64, device=self.device)
        adaln, adaln_scale = self.adaln.pop_tensor() if self.adaln is not None else (loss_sum.new_zeros(0), 1.0)
        adaln = adaln.flatten()
        reduced = torch.cat([torch.stack([loss_sum, local_g2]), bin_stats.flatten(), adaln])
        if self.world > 1:
            torch.distributed.all_reduce(reduced)
        # the step's one host synchronisation: [loss sum, |G_B|^2, pieces' |G_b|^2, sum of local |G|^2, bins...,
        # adaLN sums...]
        synced = torch.cat([torch.stack([reduced[0], g2_big, small, reduced[1]]), reduced[2:]]).tolist()
        tail = synced[4 + 2 * nbins :]
        adaln_rows = self.adaln.rows(tail, adaln_scale) if self.adaln is not None else None
        loss_total, g2_big_f, small_f, local_sum = synced[:4]
        if self.sampler is not None:
            self.sampler.observe([synced[4 + 2 * j : 6 + 2 * j] for j in range(nbins)])
        loss = loss_total / B
        if mode == GNS_RANKS and self.hook is not None:
            g2_small, b_small = local_sum / self.world, float(cfg.micro_batch_size * A)
        elif pieces:
            g2_small, b_small = small_f, B / k  # b = the mean piece size (PieceNorms)
        else:
            g2_small, b_small = None, None
        finite = math.isfinite(loss) and math.isfinite(g2_big_f)
        return StepStats(loss, g2_big_f, g2_small, b_small, B, finite, adaln_rows)
