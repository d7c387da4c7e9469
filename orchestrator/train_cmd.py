"""``bcrit train CONFIG.yaml``: one trial outside any sweep."""

from __future__ import annotations

import time

from analysis import metrics as M
from orchestrator.overrides import UserError, apply_overrides, load_yaml


def format_summary(summary: dict, num_bins: int) -> str:
    last = summary.get("last", {})
    lines = [
        f"status {summary['status']}  steps {summary[M.STEP]}  micro-steps {summary[M.MICRO_STEP]}  "
        f"examples {summary[M.EXAMPLES]}  epochs {summary[M.EPOCH]:.2f}",
        f"split  B={summary['batch_size']} = micro {summary['micro_batch_size']} x A {summary['grad_accum']}"
        f" x W {max(1, summary['num_workers'])}",
        f"time   start-up {summary['startup_seconds']:.1f}s  training {summary['train_seconds']:.1f}s  "
        f"({summary[M.EXAMPLES] / max(summary['train_seconds'], 1e-9):.0f} examples/s)",
        f"loss   train {last.get(M.TRAIN_LOSS, float('nan')):.4f}  eval {last.get(M.EVAL_LOSS, float('nan')):.4f}",
        f"gns    global: {summary['gns_global']}"
        + (f"  B_simple {last[M.GNS_B_SIMPLE]:.1f}" if M.GNS_B_SIMPLE in last else ""),
        "eval loss per timestep bin:",
    ]
    from analysis.bins import timestep_bins

    for k, (lo, hi) in enumerate(timestep_bins(num_bins)):
        v = last.get(M.per_bin(M.EVAL_LOSS_BIN, k), float("nan"))
        extra = ""
        if M.per_bin(M.GNS_BIN_B_SIMPLE, k) in last:
            extra = f"   B_simple {last[M.per_bin(M.GNS_BIN_B_SIMPLE, k)]:.1f}"
        lines.append(f"  bin {k:2d}  t {lo:3d}..{hi:3d}   {v:.4f}{extra}")
    return "\n".join(lines)


def train_command(args) -> int:
    from trainables.config import ConfigError, TrialConfig

    data = apply_overrides(load_yaml(args.config), args.set)
    try:
        cfg = TrialConfig.from_dict(data)
        from trainables.trial import check_trial

        check_trial(cfg)
    except (ConfigError, TypeError) as e:
        raise UserError(str(e)) from None
    from trainables.trial import run_trial

    name = args.name or time.strftime("train-%Y%m%d-%H%M%S")
    try:
        summary = run_trial(cfg, name=name, storage_path=args.storage)
    except ConfigError as e:  # e.g. a bad latent file met mid-training
        raise UserError(str(e)) from None
    print(format_summary(summary, cfg.timestep_bins))
    print(f"run    {summary['path']}")
    print(f"checkpoint {summary['checkpoint']}")
    return 0
