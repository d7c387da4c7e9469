"""Resuming a named trial (``bcrit train --name``): which checkpoint, and whether the new config may continue it.

A resumed trial continues its counters (step, examples, epochs) and its results. A config that changes what they
mean -- batch size, split, dataset, preset, seed, optimiser settings ... -- is refused, naming the keys; the
allowed extensions are a larger ``max_steps`` and settings that only change bookkeeping or resources
(`RESUMABLE_CHANGES`). A damaged (e.g. truncated) checkpoint is named; the newest intact one is used instead when
the runner can choose (in-process), else offered.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from trainables.checkpoint import STATE_FILE, UnsafeCheckpoint, read
from trainables.config import ConfigError

# keys a resumed trial may change: bookkeeping and resources, not what the counters or results mean. `prefetch`
# gives identical trials; `compile` the same math in other kernels (float rounding only), as `gns_halves` (the
# same update from two half-size backward passes; a run saved before the option resumes with it), and so
# `gns_global_every` (which steps do so: float rounding, and how many measurements the window holds); `gns_window` only
# re-smooths the logged B_simple (its auto value follows max_steps, so a larger budget changes it), as
# `gns_window_half` does
RESUMABLE_CHANGES = (
    "report_every",
    "checkpoint_every",
    "threads_per_worker",
    "cpus_per_worker",
    "prefetch",
    "compile",
    "gns_halves",
    "gns_global_every",
    "gns_window",
    "gns_window_half",
    "extra",
)
CHECKPOINT_GLOB = "checkpoint_*"  # both layouts: ours (checkpoint_step00000010) and Ray Train's (a date)


class DamagedCheckpoint(ConfigError):
    """A checkpoint whose state cannot be read back."""


def checkpoints(run_dir: str) -> list[str]:
    """The run's checkpoint directories, oldest first (both names sort chronologically)."""
    found = [p for p in glob.glob(os.path.join(run_dir, CHECKPOINT_GLOB)) if os.path.isdir(p)]
    return sorted(p for p in found if not p.endswith(".tmp"))


def read_state(ckpt: str) -> dict:
    """The rank-0 state of a checkpoint, or DamagedCheckpoint naming it and why. A state that holds Python objects
    (an older bcrit's, or a crafted file) is not damaged but refused: UnsafeCheckpoint, never skipped silently."""
    path = os.path.join(ckpt, STATE_FILE)
    if not os.path.isfile(path):
        raise DamagedCheckpoint(f"checkpoint {ckpt} is damaged: {STATE_FILE} is missing")
    try:
        state = read(path, mmap=True)
    except UnsafeCheckpoint:
        raise
    except Exception as e:  # noqa: BLE001 - truncated zip, bad pickle, ... all mean damaged
        reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise DamagedCheckpoint(f"checkpoint {ckpt} is damaged ({reason})") from None
    if not isinstance(state, dict) or "step" not in state or "config" not in state:
        raise DamagedCheckpoint(f"checkpoint {ckpt} is damaged: {STATE_FILE} is not a bcrit trial state")
    return state


def changed_keys(saved: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Keys whose change would alter what a resumed trial's counters or results mean."""
    out = []
    for k in sorted(set(saved) | set(new)):
        if k in RESUMABLE_CHANGES or saved.get(k) == new.get(k):
            continue
        if k == "max_steps" and new.get(k, 0) >= saved.get(k, 0):
            continue  # an allowed extension of the budget
        out.append(k)
    return out


def check_compatible(saved: dict[str, Any], new: dict[str, Any], run: str) -> None:
    keys = changed_keys(saved, new)
    if keys:
        diff = ", ".join(f"{k}: {saved.get(k)!r} -> {new.get(k)!r}" for k in keys)
        raise ConfigError(
            f"run {run!r} was trained with another config ({diff}); resuming would mix two trials. Use a new "
            "--name, or the run's own values (a larger max_steps is allowed)"
        )


def resume_point(run_dir: str, config: dict[str, Any], *, can_fall_back: bool) -> tuple[str | None, str | None]:
    """The checkpoint to resume ``run_dir`` from (None: start afresh) and a one-line note when a damaged
    checkpoint was skipped. Raises ConfigError for a config that may not continue the run, or for a damaged
    newest checkpoint when the runner cannot choose another one (``can_fall_back`` False: Ray Train resumes
    from its newest)."""
    found = checkpoints(run_dir)
    run = os.path.basename(run_dir.rstrip("/"))
    damaged: list[str] = []
    for ckpt in reversed(found):
        try:
            state = read_state(ckpt)
        except DamagedCheckpoint as e:
            if not can_fall_back:
                intact = _newest_intact(found[: found.index(ckpt)])
                offer = (
                    f"; the previous checkpoint {intact} is intact, but Ray Train resumes only from the newest: "
                    f"move the run directory aside and train again under a new --name (inspect {intact} with "
                    "`bcrit probe`)"
                    if intact
                    else "; no intact checkpoint is left: train again under a new --name"
                )
                raise ConfigError(f"{e}{offer}") from None
            damaged.append(str(e))
            continue
        check_compatible(state["config"], config, run)
        note = f"{damaged[0]}; resuming from the previous one, {ckpt}" if damaged else None
        return ckpt, note
    if damaged:
        return None, f"{damaged[0]}; no intact checkpoint is left, starting run {run!r} afresh"
    return None, None


def _newest_intact(candidates: list[str]) -> str | None:
    for ckpt in reversed(candidates):
        try:
            read_state(ckpt)
        except DamagedCheckpoint:
            continue
        return ckpt
    return None
