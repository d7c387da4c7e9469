"""The trial's configuration: one frozen, validated dataclass. Everything that changes a result lives here,
and all of it is logged (MLflow params, checkpoint, summary)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from typing import Any

from trainables.presets import PRESETS


class ConfigError(ValueError):
    """A user mistake in a trial configuration; the message is one line that names the problem and the fix."""


@dataclass(frozen=True)
class TrialConfig:
    # --- model and data --------------------------------------------------------------------------------
    preset: str = "tiny"  # key of trainables.presets.PRESETS
    dataset: str = "digits"  # "digits" (ships with the package), a packed latent store or a fast-DiT latent folder
    eval_size: int = 297  # held-out examples (digits: the last 297 of a seeded shuffle; latents: last files)
    # --- the scientific variable and how it is split ------------------------------------------------------
    batch_size: int = 32  # effective B = micro_batch_size * grad_accum * num_workers
    micro_batch_size: int = 32  # examples per forward/backward on one worker
    num_workers: int = 0  # W data-parallel ranks; 0 = run in-process (no worker actors), counts as 1
    grad_accum: int | None = None  # A; None = derived from the three above
    # --- optimisation (nuisance hyper-parameters) ---------------------------------------------------------
    lr: float = 1e-3  # AdamW peak learning rate
    warmup_steps: int = 0  # linear warm-up, then constant
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    grad_clip: float = 0.0  # max global grad norm; 0 = no clipping
    ema_decay: float = 0.0  # EMA of weights (diffusers EMAModel); 0 = off
    class_dropout: float = 0.1  # classifier-free guidance label dropout probability
    # --- budget and stopping (decided inside the loop: REFERENCE.md, placement-group leak) ---------------
    seed: int = 0
    max_steps: int = 200  # step budget
    target_loss: float | None = None  # stop once eval/loss <= this
    divergence_factor: float = 3.0  # diverged once eval/loss > factor * first eval/loss (or any non-finite loss)
    # --- evaluation for steps-to-target ------------------------------------------------------------------
    eval_every: int = 10  # steps between held-out evaluations
    eval_repeats: int = 2  # fixed noise draws per held-out example (more = lower-noise eval loss)
    eval_ema: bool = False  # evaluate the EMA weights instead of the training weights
    timestep_bins: int = 10  # K equal bins partitioning 0..999
    # --- gradient noise scale -----------------------------------------------------------------------------
    gns: bool = True  # global GNS every step (needs num_workers * grad_accum >= 2)
    gns_ema_beta: float = 0.95  # smoothing of the live B_simple (numerator and denominator separately)
    gns_every: int = 300  # per-bin GNS cadence in steps (0 = off); one pass ~13 steps of B=32 (K=10): ~4.3%
    gns_bin_examples: int = 32  # examples per bin per measurement (split in two halves); 0 = micro_batch_size
    # --- reporting and checkpoints ------------------------------------------------------------------------
    report_every: int = 0  # steps between reports to Ray; 0 = eval_every
    checkpoint_every: int = 0  # steps between checkpoints (a multiple of report_every); 0 = only at the end
    # --- resources ----------------------------------------------------------------------------------------
    use_gpu: bool = False  # one GPU per worker, NCCL, bf16 autocast
    bf16: bool = True  # bf16 autocast when on GPU (ignored on CPU)
    cpus_per_worker: int = 1
    threads_per_worker: int = 0  # torch intra-op threads per worker; 0 = cpus_per_worker
    prefetch: int = 2  # micro-batches gathered ahead by a background thread; 0 = in the step (same results)
    extra: dict = field(default_factory=dict, compare=False, repr=False)  # free-form tags (not used by training)

    # ---------------------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        validate(self)

    @property
    def world_size(self) -> int:
        return max(1, self.num_workers)

    @property
    def accum(self) -> int:
        return self.batch_size // (self.micro_batch_size * self.world_size)

    @property
    def report_interval(self) -> int:
        return self.report_every or self.eval_every

    @property
    def bin_examples(self) -> int:
        return self.gns_bin_examples or self.micro_batch_size

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["grad_accum"] = self.accum
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialConfig:
        return config_from_dict(cls, data)

    def replace(self, **changes: Any) -> TrialConfig:
        return TrialConfig.from_dict({**self.to_dict(), **changes})


def config_from_dict(cls, data: dict[str, Any], what: str = "config"):
    """Build a frozen config dataclass from YAML / ``--set`` data: unknown keys rejected, values coerced to the
    fields' types, each mistake one `ConfigError` line."""
    types = {f.name: str(f.type) for f in fields(cls)}
    unknown = sorted(set(data) - set(types))
    if unknown:
        raise ConfigError(f"unknown {what} key(s) {unknown}; valid keys: {sorted(set(types) - {'extra'})}")
    return cls(**{k: _coerce(k, types[k], v) for k, v in data.items()})


def _coerce(key: str, kind: str, value: Any) -> Any:
    """Coerce YAML / ``--set`` values to the field's type, with a clear error."""
    if value is None or key == "extra":
        return value
    try:
        if kind.startswith("bool"):
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                return value.lower() in ("true", "1", "yes")
            return bool(value)
        if kind.startswith("int"):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if kind.startswith("float"):
            return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"config key {key!r} must be {kind.split(' ')[0]}, got {value!r}") from None
    return value


def validate(c: TrialConfig) -> None:
    """Raise one ConfigError for the first impossible setting, before any worker starts."""
    if c.preset not in PRESETS:
        raise ConfigError(f"unknown preset {c.preset!r}; choose one of {list(PRESETS)}")
    for name in (
        "batch_size",
        "micro_batch_size",
        "max_steps",
        "eval_every",
        "eval_repeats",
        "cpus_per_worker",
    ):
        if getattr(c, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(c, name)}")
    if c.num_workers < 0:
        raise ConfigError(f"num_workers must be >= 0 (0 = in-process), got {c.num_workers}")
    if not 0 <= c.prefetch <= 64:
        raise ConfigError(f"prefetch must be in 0..64 micro-batches (0 = no background gather), got {c.prefetch}")
    per_step = c.micro_batch_size * c.world_size
    if c.batch_size % per_step:
        raise ConfigError(
            f"batch_size {c.batch_size} is not divisible by micro_batch_size x workers = {per_step}; "
            f"pick a batch size that is a multiple of {per_step}"
        )
    if c.grad_accum is not None:
        if c.grad_accum < 1:
            raise ConfigError(f"grad_accum must be >= 1, got {c.grad_accum}")
        if c.grad_accum != c.accum:
            raise ConfigError(
                f"batch_size {c.batch_size} != micro_batch_size {c.micro_batch_size} x grad_accum {c.grad_accum}"
                f" x workers {c.world_size}; fix one of them (or drop grad_accum to derive it)"
            )
    if not c.lr > 0:
        raise ConfigError(f"lr must be > 0, got {c.lr}")
    if not 0 <= c.ema_decay < 1:
        raise ConfigError(f"ema_decay must be in [0, 1), got {c.ema_decay}")
    if not 0 <= c.class_dropout < 1:
        raise ConfigError(f"class_dropout must be in [0, 1), got {c.class_dropout}")
    if not 0 < c.gns_ema_beta < 1:
        raise ConfigError(f"gns_ema_beta must be in (0, 1), got {c.gns_ema_beta}")
    if c.divergence_factor <= 1:
        raise ConfigError(f"divergence_factor must be > 1, got {c.divergence_factor}")
    if not 1 <= c.timestep_bins <= 1000:
        raise ConfigError(f"timestep_bins must be in 1..1000, got {c.timestep_bins}")
    if c.report_every < 0 or c.checkpoint_every < 0 or c.gns_every < 0 or c.gns_bin_examples < 0:
        raise ConfigError("report_every, checkpoint_every, gns_every and gns_bin_examples must be >= 0")
    if c.gns_every and c.bin_examples < 2:
        raise ConfigError("per-bin GNS needs gns_bin_examples >= 2 (two halves of at least one example)")
    if c.gns_every and c.bin_examples % 2:
        raise ConfigError(f"gns_bin_examples must be even (two equal halves), got {c.bin_examples}")
    if c.checkpoint_every and c.checkpoint_every % c.report_interval:
        raise ConfigError(
            f"checkpoint_every {c.checkpoint_every} must be a multiple of report_every {c.report_interval}"
        )
    if c.eval_size < c.timestep_bins:
        raise ConfigError(f"eval_size {c.eval_size} must be >= timestep_bins {c.timestep_bins}")
    if c.dataset != "digits" and not os.path.isdir(c.dataset):
        raise ConfigError(
            f"dataset {c.dataset!r} is neither 'digits' nor an existing packed latent store (bcrit pack-latents) "
            "or fast-DiT latent folder (with imagenet256_features/ and imagenet256_labels/)"
        )
