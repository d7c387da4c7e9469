"""DDPM training objective: epsilon prediction, MSE, per example (diffusers ``DDPMScheduler``, T=1000, linear)."""

from __future__ import annotations

import torch
from diffusers import DDPMScheduler

NUM_TIMESTEPS = 1000


def make_scheduler() -> DDPMScheduler:
    return DDPMScheduler(num_train_timesteps=NUM_TIMESTEPS, beta_schedule="linear", prediction_type="epsilon")


def per_example_loss(
    model: torch.nn.Module,
    scheduler: DDPMScheduler,
    x0: torch.Tensor,  # (n, C, H, W) clean images / latents
    labels: torch.Tensor,  # (n,) class ids; num_classes = the null (dropped) class
    timesteps: torch.Tensor,  # (n,) int64 in 0..T-1
    noise: torch.Tensor,  # (n, C, H, W) standard normal
) -> torch.Tensor:
    """``|eps_theta(x_t, t, y) - eps|^2`` averaged over pixels: shape (n,), float32."""
    xt = scheduler.add_noise(x0, noise, timesteps)  # (n, C, H, W)
    pred = model(xt, timestep=timesteps, class_labels=labels).sample  # (n, C, H, W)
    return (pred.float() - noise.float()).pow(2).flatten(1).mean(1)  # (n,)
