"""The two hooks a trial needs for a branched study (analysis.features.branched.branched; Merrill et al. 2025):

- the **reference** keeps its checkpoints at the branch points: ``keep_dir`` + ``keep_steps`` in the trial config
  (a copy under ``<keep_dir>/step<N>``, independent of how many checkpoints Ray Train or Tune retain);
- a **branch** starts from one of them: ``init_from`` in the trial config. Weights and optimizer state (Adam
  moments and step count, or the NQM's parameters) come from the checkpoint; the learning rate is the branch's own
  (``lr``, already scaled by the study's rule), and the counters start at 0, so a branch's ``step`` and
  ``examples`` count from the branch point. A retried branch resumes from its *own* checkpoints instead (the
  session's restore wins over ``init_from``).
"""

from __future__ import annotations

import json
import os
import shutil

KEPT_PREFIX = "step"


def kept_path(keep_dir: str, step: int) -> str:
    """Where the reference's checkpoint at ``step`` is kept."""
    return os.path.join(keep_dir, f"{KEPT_PREFIX}{int(step):08d}")


def keep_checkpoint(keep_dir: str | None, keep_steps, step: int, checkpoint_dir: str) -> None:
    """Copy this rank's checkpoint files to ``kept_path(keep_dir, step)`` when ``step`` is a branch point.

    Every rank copies its own files (rank 0's state, each rank's RNG) into the same directory, like Ray Train
    merging a checkpoint; the copy goes to a temporary name first, so a kept directory is complete or absent."""
    if not keep_dir or int(step) not in {int(s) for s in keep_steps or ()}:
        return
    dest = kept_path(keep_dir, step)
    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(checkpoint_dir):
        tmp = os.path.join(dest, f".{name}.tmp-{os.getpid()}")
        shutil.copy2(os.path.join(checkpoint_dir, name), tmp)
        os.replace(tmp, os.path.join(dest, name))


def start_dit(init_from: str, lr: float, model, opt, ema) -> int:
    """Load weights, optimizer state and EMA of a DiT checkpoint, set the branch's learning rate; return the
    checkpoint's step (the branch point)."""
    from trainables.checkpoint import STATE_FILE, read

    path = os.path.join(init_from, STATE_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"init_from {init_from!r} is not a bcrit trial checkpoint (no {STATE_FILE})")
    state = read(path)  # data only: a state holding Python objects is refused (UnsafeCheckpoint)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    for group in opt.param_groups:  # the checkpoint carries the reference's lr: the branch uses its own
        group["lr"] = lr
        group["initial_lr"] = lr
    if ema is not None and state.get("ema") is not None:
        ema.load_state_dict(state["ema"])
    return int(state["step"])


def start_quadratic(init_from: str, state_file: str):
    """``(theta, step)`` of a quadratic-workload checkpoint."""
    import numpy as np

    path = os.path.join(init_from, state_file)
    if not os.path.exists(path):
        raise FileNotFoundError(f"init_from {init_from!r} is not a quadratic checkpoint (no {state_file})")
    with open(path) as f:
        s = json.load(f)
    return np.asarray(s["theta"], dtype=np.float64), int(s["step"])
