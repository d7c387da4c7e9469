"""Run a test worker on a real multi-process gloo group and collect what each rank wrote.

"spawn", not "fork": a forked child inherits the parent's OpenMP/MKL thread-pool state, and touching it
(``torch.set_num_threads``) hung intermittently here. Each child re-imports torch (a few seconds), the price
of a reliable test. A hung group is killed and the test fails after ``timeout_s``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_group(worker: Callable[[int, int, int, str], None], world: int, out_dir: Path, timeout_s: float) -> list[dict]:
    """``worker(rank, world, port, out_dir)`` on ``world`` spawned processes; each writes ``rank{r}.json``."""
    ctx = mp.start_processes(
        worker, args=(world, free_port(), str(out_dir)), nprocs=world, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"DDP workers did not finish within {timeout_s} s")
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
