"""Trial checkpoints: everything needed to continue exactly.

Layout of one checkpoint directory (Ray Train merges the per-rank files into one directory):
- ``state.pt`` (rank 0): model, optimizer, LR scheduler, EMA, GNS smoothing state, counters, first eval loss,
  elapsed training seconds, and the trial config it was written by.
- ``rng_rank{r}.pt`` (every rank): torch CPU (and CUDA) RNG, numpy and python RNG states of rank ``r``.
The data position is the step counter: batches are a pure function of ``(seed, step)`` (see randomness.py).
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

STATE_FILE = "state.pt"


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def save(directory: str, rank: int, state: dict | None) -> None:
    os.makedirs(directory, exist_ok=True)
    if state is not None:
        torch.save(state, os.path.join(directory, STATE_FILE))
    rng = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy": np.random.get_state(),  # noqa: NPY002 (the legacy global RNG is what we save)
        "python": random.getstate(),
    }
    torch.save(rng, os.path.join(directory, rng_file(rank)))


def load(directory: str, rank: int) -> dict:
    """The rank-0 state, after restoring this rank's RNG states (when the checkpoint has them)."""
    path = os.path.join(directory, STATE_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{directory} is not a bcrit trial checkpoint (no {STATE_FILE})")
    state = torch.load(path, map_location="cpu", weights_only=False)
    rng_path = os.path.join(directory, rng_file(rank))
    if os.path.exists(rng_path):
        rng = torch.load(rng_path, map_location="cpu", weights_only=False)
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        np.random.set_state(rng["numpy"])  # noqa: NPY002
        random.setstate(rng["python"])
    return state
