"""Non-uniform training timesteps with importance weights (config ``timestep_sampling``; docs/allocation.md).

``uniform`` (the default) is not handled here: the step keeps its original draws bit for bit. ``noise`` and ``loss``
draw each example's bin ``k`` from an allocation ``p``, its timestep uniformly within the bin, and weight its loss by
``w_k = q_k / p_k`` (``analysis.core.allocation``), so the gradient stays unbiased for the uniform objective. ``p`` is
re-estimated every ``alloc_every`` steps and mixed with a uniform floor ``alloc_floor``: ``noise``: ``p_k ∝ q_k
sqrt(m_k)``, ``m_k = mean tr Sigma_k + mean |G_k|^2`` over the per-bin GNS window (Neyman allocation); ``loss``: ``p_k
∝ q_k sqrt(E[L^2]_k)`` over the last ``alloc_history`` steps that drew bin k (improved-diffusion's
``LossSecondMomentResampler``, per bin), uniform until every bin has that history.

Draws: after the step's usual ``(t, u, noise)`` (``trainables.randomness.step_draws``: label drops and noise as a
uniform trial's), the same keyed generator draws two float64 uniforms per global-batch position (bin by the inverse
CDF of ``p``, then the timestep); every rank draws the whole batch and slices its positions (split-invariant). The
allocation and loss history are plain lists (checkpoints load with ``weights_only``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from analysis.core import metrics as M
from analysis.core.allocation import bin_shares, loss_allocation, noise_allocation
from analysis.core.bins import timestep_bins

SAMPLING_NOISE, SAMPLING_LOSS = "noise", "loss"


class TimestepSampler:
    """The allocation of one trial: its draws, its per-bin loss history (``loss``) and its re-estimation."""

    def __init__(self, cfg, num_timesteps: int, device: torch.device) -> None:
        self.kind, self.every, self.floor = cfg.timestep_sampling, cfg.alloc_every, cfg.alloc_floor
        self.history_len = cfg.alloc_history
        self.q = bin_shares(cfg.timestep_bins, num_timesteps)  # (K,) uniform bin probabilities
        bins = timestep_bins(cfg.timestep_bins, num_timesteps)
        self.lo = torch.tensor([lo for lo, _ in bins], dtype=torch.int64, device=device)  # (K,)
        self.width = torch.tensor([hi - lo + 1 for lo, hi in bins], dtype=torch.int64, device=device)  # (K,)
        self.device = device
        self.p = self.q.copy()  # the allocation in use; starts uniform
        self.history: list[list[float]] = [[] for _ in bins]  # loss: per bin, mean L^2 of recent steps

    @property
    def num_bins(self) -> int:
        return len(self.q)

    def draw(self, generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(timesteps int64 [B], weights float32 [B], bins int64 [B])`` of the global batch, continuing the step's
        keyed generator (called right after ``step_draws``)."""
        v = torch.rand(batch_size, generator=generator, device=self.device, dtype=torch.float64)  # (B,) bin
        r = torch.rand(batch_size, generator=generator, device=self.device, dtype=torch.float64)  # (B,) within
        cdf = torch.tensor(np.cumsum(self.p) / np.sum(self.p), dtype=torch.float64, device=self.device)  # (K,)
        k = torch.searchsorted(cdf, v, right=True).clamp_(max=self.num_bins - 1)  # (B,)
        width = self.width[k]
        t = self.lo[k] + torch.minimum((r * width).long(), width - 1)  # (B,) uniform within the bin
        w = torch.tensor(self.q / self.p, dtype=torch.float32, device=self.device)[k]  # (B,) q_k / p_k
        return t, w, k

    def bin_stats(self, losses: torch.Tensor, k: torch.Tensor, out: torch.Tensor) -> None:
        """Add per-bin ``[sum of L^2, count]`` of a micro-batch's unweighted per-example losses to ``out`` (K, 2)."""
        if self.kind != SAMPLING_LOSS:
            return
        out[:, 0].index_add_(0, k, losses.detach().double().square())
        out[:, 1].index_add_(0, k, torch.ones_like(k, dtype=torch.float64))

    def observe(self, stats: list[list[float]]) -> None:
        """Record one step's all-reduced per-bin ``[sum L^2, count]`` (``loss`` only) in the bounded history."""
        if self.kind != SAMPLING_LOSS:
            return
        for hist, (s, n) in zip(self.history, stats, strict=True):
            if n > 0:
                hist.append(s / n)
                del hist[: max(0, len(hist) - self.history_len)]

    def update(self, done: int, bin_windows) -> dict[str, float]:
        """Re-estimate the allocation after step ``done`` when due; returns the ``alloc/bin{k}/p`` rows then."""
        if not self.every or done % self.every:
            return {}
        if self.kind == SAMPLING_NOISE:
            m = [_window_m(w) for w in bin_windows]
            if all(x is not None for x in m):  # every bin measured at least once
                self.p = noise_allocation(m, self.q, self.floor)
        elif all(len(h) >= self.history_len for h in self.history):  # warmed up (improved-diffusion)
            self.p = loss_allocation([np.mean(h) for h in self.history], self.q, self.floor)
        return {M.per_bin(M.ALLOC_BIN_P, k): float(pk) for k, pk in enumerate(self.p)}

    def state_dict(self) -> dict[str, Any]:
        """Plain lists (JSON-able): the allocation and the loss history."""
        return {"kind": self.kind, "p": [float(x) for x in self.p], "history": [list(h) for h in self.history]}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore; ``None`` (a checkpoint of a uniform trial) keeps the uniform start. Raises on a bin mismatch."""
        if state is None:
            return
        if len(state["p"]) != self.num_bins or len(state["history"]) != self.num_bins:
            raise ValueError(f"timestep sampler state has {len(state['p'])} bins, this trial {self.num_bins}")
        self.p = np.asarray(state["p"], dtype=np.float64)
        self.history = [[float(x) for x in h] for h in state["history"]]


def _window_m(window) -> float | None:
    """``mean tr Sigma_k + mean |G_k|^2`` over a per-bin ``GNSWindow``'s measurements; None when it is empty."""
    g2, trace = window.state_dict()["g2"], window.state_dict()["trace"]
    if not g2:
        return None
    return float(np.mean(g2) + np.mean(trace))
