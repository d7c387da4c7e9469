"""The DiT trial's learning-rate schedule: linear warm-up then constant (diffusers), times the batch-size stage's
factor under a ``batch_schedule`` (`analysis.core.stages`: ``lr x sqrt(B / B_0)`` for Adam by default, the rule a
branched study uses for its branches)."""

from __future__ import annotations

import torch


def lr_schedule(opt: torch.optim.Optimizer, cfg) -> torch.optim.lr_scheduler.LambdaLR:
    """The scheduler of ``opt``: stepped once per optimizer step, its ``last_epoch`` is the steps done, so the
    factor of the step about to be taken is the stage's (exact after a resume: the lambda is recomputed, the
    scheduler's state holds only the step count)."""
    from diffusers.optimization import get_constant_schedule_with_warmup

    sched = get_constant_schedule_with_warmup(opt, num_warmup_steps=cfg.warmup_steps)
    stages, rule = cfg.stages, cfg.schedule_lr_rule
    if stages.constant:
        return sched  # no schedule: diffusers' scheduler as it always was
    warm, base = sched.lr_lambdas[0], cfg.lr
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: warm(step) * stages.lr(step, base, rule) / base)
