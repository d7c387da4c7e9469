"""Per-timestep-bin gradient noise scale, measured inside the trial by a bin-restricted measurement pass.

Per timestep bin ``k``, ``G_k`` and ``Sigma_k`` are the gradient and per-example covariance of the training loss
restricted to ``t in bin k``; two batch sizes give unbiased ``|G_k|^2`` and ``tr(Sigma_k)`` (``analysis.core.gns``).
Every ``gns_every`` steps, for each bin (bins round-robin over the ranks): draw ``n = cfg.bin_examples`` iid examples
of the bin from one private generator keyed by ``(seed, STREAM_GNS, step, k)`` (indices uniform with replacement,
``t`` uniform in the bin, normal noise, label drop ``cfg.class_dropout``); take the gradients of the two halves' mean
losses by ``torch.autograd.grad`` on the *unwrapped* model (nothing reaches ``.grad`` or the optimizer; no
collective); ``|G_b|^2`` is the mean of the halves' squared norms (``b = n/2``), ``|G_B|^2`` the squared norm of their
mean (``B = n``); one ``all_reduce`` of a ``(K, 4)`` float64 tensor shares every bin's row. No global RNG is touched,
so training with the measurement on and off is bit-identical (docs/design.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from analysis.core.bins import timestep_bins
from analysis.core.gns import GNSWindow, live_metrics
from trainables.diffusion import NUM_TIMESTEPS, per_example_loss
from trainables.gns_stats import sq_norm
from trainables.randomness import STREAM_GNS, mix

__all__ = ["BinGNS", "draw_examples", "measurement_key", "sub_batch_sq_norms"]

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # x0, labels, timesteps, noise


def measurement_key(seed: int, step: int, k: int) -> int:
    """Seed of the private generator of bin ``k``'s measurement at ``step`` (disjoint from training streams)."""
    return mix(seed, STREAM_GNS, step, k)


def draw_examples(data, key: int, n: int, lo: int, hi: int, class_dropout: float) -> Batch:
    """``n`` iid draws from the training distribution restricted to timesteps ``lo..hi`` (inclusive).

    Indices uniform with replacement over the training set, ``t`` uniform in ``lo..hi``, standard normal
    noise, label dropped to the null class with probability ``class_dropout``. Only a private
    ``torch.Generator`` seeded with ``key`` is used (no global RNG). Returns CPU tensors
    ``x0 (n, C, H, W)``, ``labels (n,)``, ``timesteps (n,)``, ``noise (n, C, H, W)``.
    """
    g = torch.Generator().manual_seed(key)
    idx = torch.randint(0, data.info.train_size, (n,), generator=g)  # (n,) with replacement
    x, y = data.get(idx.numpy())  # (n, C, H, W), (n,)
    t = torch.randint(lo, hi + 1, (n,), generator=g)  # (n,)
    u = torch.rand(n, generator=g)  # (n,)
    noise = torch.randn(x.shape, generator=g, dtype=x.dtype)  # (n, C, H, W)
    y = torch.where(u < class_dropout, data.info.num_classes, y)  # label drop -> null class
    return x, y, t, noise


def sub_batch_sq_norms(
    model: torch.nn.Module,
    params: Sequence[torch.nn.Parameter],
    scheduler,
    batch: Batch,
    b: int,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager] | None = None,
) -> tuple[float, float]:
    """``(|G_b|^2, |G_B|^2)`` of a batch of ``B = m b`` iid examples cut into ``m`` consecutive groups of ``b``.

    Each group's gradient is that of its *mean* loss, by ``torch.autograd.grad`` (``.grad`` is untouched);
    ``|G_b|^2`` is the mean of the ``m`` squared norms, ``|G_B|^2`` the squared norm of the groups' mean
    gradient (= the gradient of the whole batch's mean loss). Streaming: only the running sum of group
    gradients is kept, so ``m`` can be large. Same numbers as ``analysis.core.gns.from_subbatch_grads`` on the
    stacked group gradients (McCandlish et al. 2018, App. A.1). Squared norms accumulate in float64.
    """
    x, y, t, noise = batch
    n = len(t)
    if b < 1 or n % b or n // b < 2:
        raise ValueError(f"need a batch of m >= 2 groups of b examples, got {n} examples and b={b}")
    m = n // b
    sq_sum = torch.zeros((), dtype=torch.float64, device=device)
    total: list[torch.Tensor] | None = None
    for i in range(m):
        sl = slice(i * b, (i + 1) * b)
        with autocast() if autocast is not None else torch.autocast(device.type, enabled=False):
            losses = per_example_loss(
                model, scheduler, x[sl].to(device), y[sl].to(device), t[sl].to(device), noise[sl].to(device)
            )  # (b,)
        grads = torch.autograd.grad(losses.mean(), params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]
        sq_sum += sq_norm(grads)
        if total is None:
            total = grads
        else:
            torch._foreach_add_(total, grads)
    g2_small = sq_sum / m
    g2_big = sq_norm(total) / (m * m)
    return float(g2_small.item()), float(g2_big.item())


class BinGNS:
    """Per-bin ``|G_b|^2, |G_B|^2, b, B``, unbiased ``|G_k|^2``, ``tr(Sigma_k)`` and ``B_simple,k ± SE``.

    One ``GNSWindow`` per bin averages numerator and denominator separately over the measurements of the last
    ``cfg.gns_steps`` optimizer steps -- the global value's window in steps, not in measurements
    (McCandlish et al. 2018, App. A.1; ``analysis.core.gns.GNSWindow``).
    Bin ``k`` is measured by rank ``k mod W``; works for any ``W`` and ``A`` (``A`` plays no part).
    """

    def __init__(
        self,
        cfg,
        model: torch.nn.Module,
        data,
        scheduler,
        rank: int,
        world: int,
        device: torch.device,
        autocast: Callable[[], AbstractContextManager],
    ) -> None:
        self.cfg, self.model, self.data, self.scheduler = cfg, model, data, scheduler
        self.rank, self.world, self.device, self.autocast = rank, world, torch.device(device), autocast
        self.bins = timestep_bins(cfg.timestep_bins, NUM_TIMESTEPS)
        self.n = cfg.bin_examples  # examples per bin per measurement: two halves of n/2
        if self.n < 2 or self.n % 2:
            raise ValueError(f"per-bin GNS needs an even number >= 2 of examples per bin, got {self.n}")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.windows = [GNSWindow(cfg.gns_steps) for _ in self.bins]

    @property
    def my_bins(self) -> range:
        """Bins this rank measures (round-robin)."""
        return range(self.rank, len(self.bins), self.world)

    def local_stats(self, step: int) -> torch.Tensor:
        """``(K, 4)`` float64 rows ``[|G_b|^2, |G_B|^2, b, B]`` for this rank's bins, zeros elsewhere."""
        stats = torch.zeros(len(self.bins), 4, dtype=torch.float64)
        for k in self.my_bins:
            lo, hi = self.bins[k]
            batch = draw_examples(
                self.data, measurement_key(self.cfg.seed, step, k), self.n, lo, hi, self.cfg.class_dropout
            )
            small, big = sub_batch_sq_norms(
                self.model, self.params, self.scheduler, batch, self.n // 2, self.device, self.autocast
            )
            stats[k] = torch.tensor([small, big, self.n // 2, self.n], dtype=torch.float64)
        return stats

    def measure(self, step: int) -> dict[str, float]:
        """Measure every bin at ``step`` (collective when ``W > 1``: every rank must call it); metric -> value."""
        stats = self.local_stats(step).to(self.device)
        if self.world > 1:
            torch.distributed.all_reduce(stats)  # each row is non-zero on exactly one rank
        out: dict[str, float] = {}
        for k, (g2_small, g2_big, b, B) in enumerate(stats.cpu().tolist()):
            # a non-finite measurement (diverging weights) is logged raw but kept out of the window
            out.update(live_metrics(self.windows[k], step, g2_small, g2_big, b, B, k))
        return out

    def state_dict(self) -> dict[str, Any]:
        """Plain-python state (the per-bin windows) for checkpoints."""
        return {"num_bins": len(self.bins), "windows": [w.state_dict() for w in self.windows]}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore from ``state_dict()``; ``None`` (a checkpoint written with per-bin GNS off) starts empty windows,
        as does a checkpoint from before the window rule (``"emas"``). Raises ValueError when the bin count differs."""
        if state is None:
            return
        saved = state.get("windows", state.get("emas", ()))
        if int(state.get("num_bins", -1)) != len(self.bins) or len(saved) != len(self.bins):
            raise ValueError(f"per-bin GNS state has {state.get('num_bins')} bins, this trial {len(self.bins)}")
        for window, s in zip(self.windows, saved, strict=True):
            window.load_state_dict(s)
