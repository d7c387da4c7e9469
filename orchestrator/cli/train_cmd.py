"""``bcrit train CONFIG.yaml``: one trial outside any sweep."""

from __future__ import annotations

import time

from analysis.core import metrics as M
from orchestrator.cli import options
from orchestrator.errors import UserError
from orchestrator.specs.yaml_overrides import apply_overrides, load_yaml


def register(sub) -> None:
    p = options.command(
        sub,
        "train",
        "run one DiT trial outside any sweep",
        "Run one DiT trial outside any sweep and print its summary.",
        [
            "bcrit train examples/trial.yaml",
            "bcrit train examples/trial.yaml --set lr=3e-4 --set max_steps=200 --name lr3e-4",
            "bcrit train examples/trial.yaml --name base       # again: continues ./runs/base from its checkpoint",
        ],
    )
    p.add_argument("config", metavar="CONFIG", help="trial config YAML (the keys of docs/trial.md)")
    options.overrides(p)
    p.add_argument("--name", default=None, help="run name (a run of the same name in --storage resumes)")
    p.add_argument(
        "--storage", default="runs", metavar="DIR", help="where the run's checkpoints are written (default: ./runs)"
    )
    options.verbose(p)
    p.set_defaults(func=train_command, uses_ray=True)


def _b_simple(last: dict, k: int | None = None) -> str:
    """``B_simple x ± se`` of the latest window (global or bin ``k``), plus how often it was undefined."""
    names = M.gns_names(k)
    out = ""
    if names["b_simple"] in last and names["b_simple_se"] in last:
        out = f"  B_simple {last[names['b_simple']]:.3g} ± {last[names['b_simple_se']]:.2g}"
    if last.get(names["b_simple_undefined"]):
        out += f"  (undefined at {last[names['b_simple_undefined']]:.0f} updates)"
    return out


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
        + _b_simple(last)
        + (f"  (window {summary['gns_window']} steps" if "gns_window" in summary else "")
        + (", at most the last half" if summary.get("gns_window_half") else "")
        + (")" if "gns_window" in summary else ""),
        "eval loss per timestep bin:",
    ]
    from analysis.core.bins import timestep_bins

    for k, (lo, hi) in enumerate(timestep_bins(num_bins)):
        v = last.get(M.per_bin(M.EVAL_LOSS_BIN, k), float("nan"))
        lines.append(f"  bin {k:2d}  t {lo:3d}..{hi:3d}   {v:.4f}{_b_simple(last, k)}")
    return "\n".join(lines)


def train_command(args) -> int:
    from trainables.config import ConfigError, TrialConfig

    data = apply_overrides(load_yaml(args.config, allow_empty=bool(args.set)), args.set)
    resources = _cluster_resources(args)
    try:
        cfg = TrialConfig.from_dict(data)
        from trainables.trial import check_trial

        check_trial(cfg, resources)
    except (ConfigError, TypeError) as e:
        raise UserError(str(e)) from None
    from orchestrator.storage.shared_dir import check_storage

    name = args.name or time.strftime("train-%Y%m%d-%H%M%S")
    if not name.strip() or "/" in name or name in (".", ".."):
        raise UserError(f"--name {name!r}: a run name is one non-empty path component, e.g. --name base")
    from orchestrator.storage.shared_dir import check_storage_value

    check_storage_value(args.storage, what="--storage", who="bcrit train")
    check_storage(args.storage, what="--storage")
    try:
        summary = _run_with_progress(cfg, name, args.storage, getattr(args, "verbose", False), resources)
    except ConfigError as e:  # a damaged checkpoint, a config that may not continue it, a bad latent file
        raise UserError(str(e)) from None
    if summary.get("note"):
        print(f"bcrit train: warning: {summary['note']}")
    print(format_summary(summary, cfg.timestep_bins))
    print(f"run    {summary['path']}")
    print(f"checkpoint {summary['checkpoint']}")
    return 0


def _cluster_resources(args) -> dict | None:
    """With ``RAY_ADDRESS``: join the cluster and return what it can hold (its autoscaler's node types included)
    for the trial's check; None (this machine) otherwise."""
    from orchestrator.cluster.ray_start import acquire_ray

    return acquire_ray(getattr(args, "verbose", False)).resources()


def _run_with_progress(cfg, name: str, storage: str, verbose: bool, resources: dict | None = None) -> dict:
    """``run_trial`` with a live progress bar (drawn from the file Train's controller rewrites after each report;
    an in-process trial, ``num_workers: 0``, runs without Train's callbacks and shows no bar)."""
    import os
    import tempfile

    from orchestrator.records.progress import ProgressFileCallback, TrainProgress
    from trainables.trial import run_trial

    with tempfile.TemporaryDirectory(prefix="bcrit-progress-") as d:
        path = os.path.join(d, "progress.json")
        with TrainProgress(path, cfg.max_steps, cfg.target_loss):
            return run_trial(
                cfg,
                name=name,
                storage_path=storage,
                callbacks=[ProgressFileCallback(path)],
                log_level="INFO" if verbose else "WARNING",
                resources=resources,
            )
