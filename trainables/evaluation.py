"""Held-out evaluation for steps-to-target: a low-noise loss from common random numbers.

Every trial of every sweep sees the same held-out examples, the same noise and the same timesteps: position
``p = r * eval_size + i`` (example ``i``, repeat ``r``) lies in timestep bin ``p mod K``, its timestep is uniform
inside that bin and its noise standard normal, both from a generator keyed by a fixed seed and ``p``. Bin counts
differ by at most one (the first ``(eval_size * repeats) mod K`` bins get one more), so ``eval/loss`` (the mean over
all positions) weighs the bins alike up to that one example, as uniform timesteps do.

The draws are made once per trial on the CPU (stream ``STREAM_EVAL``, disjoint from training's
``STREAM_EXAMPLE`` and per-bin GNS's ``STREAM_GNS``), so they are the same on every device; the examples, noise
and timesteps are then moved to the device once, and an evaluation reads its sums back once.
"""

from __future__ import annotations

import numpy as np
import torch

from analysis.core.bins import timestep_bins
from trainables.diffusion import NUM_TIMESTEPS, per_example_loss
from trainables.randomness import STREAM_EVAL, mix

EVAL_SEED = 1812_06162  # fixed for every trial: common random numbers across a sweep
EVAL_CHUNK = 256


class HeldOutEval:
    def __init__(self, dataset, repeats: int, num_bins: int, rank: int, world_size: int, device):
        n = dataset.info.eval_size
        self.num_bins = num_bins
        self.device = device
        bins = timestep_bins(num_bins, NUM_TIMESTEPS)
        positions = np.arange(rank, n * repeats, world_size)  # this rank's share of the positions
        self.bin_of = torch.from_numpy(positions % num_bins)
        x, y = dataset.get(positions % n, split="eval")
        g = torch.Generator()
        ts, noise = [], []
        for p in positions:
            g.manual_seed(mix(EVAL_SEED, STREAM_EVAL, int(p)))
            lo, hi = bins[p % num_bins]
            ts.append(torch.randint(lo, hi + 1, (1,), generator=g))
            noise.append(torch.randn(x.shape[1:], generator=g))
        self.bin_of = self.bin_of.to(device)
        self.x, self.y = x.to(device), y.to(device)
        self.t = (torch.cat(ts) if ts else torch.zeros(0, dtype=torch.int64)).to(device)
        self.noise = (torch.stack(noise) if noise else torch.zeros((0, *x.shape[1:]))).to(device)

    @torch.inference_mode()  # bit for bit no_grad's losses, without autograd's bookkeeping, so faster
    def __call__(self, model, scheduler, autocast) -> tuple[float, list[float]]:
        """``(eval_loss, [eval_loss_bin_k])`` over all ranks (all-reduced when distributed)."""
        was_training = model.training
        model.eval()
        sums = torch.zeros(self.num_bins, dtype=torch.float64, device=self.device)
        counts = torch.zeros(self.num_bins, dtype=torch.float64, device=self.device)
        for s in range(0, len(self.t), EVAL_CHUNK):
            sl = slice(s, s + EVAL_CHUNK)
            with autocast():
                loss = per_example_loss(model, scheduler, self.x[sl], self.y[sl], self.t[sl], self.noise[sl])
            sums.index_add_(0, self.bin_of[sl], loss.double())
            counts.index_add_(0, self.bin_of[sl], torch.ones_like(loss, dtype=torch.float64))
        stats = torch.cat([sums, counts])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(stats)
        stats = stats.cpu()  # the evaluation's one host read
        sums, counts = stats[: self.num_bins], stats[self.num_bins :]
        model.train(was_training)
        per_bin = (sums / counts.clamp(min=1)).tolist()
        return float(sums.sum() / counts.sum()), per_bin
