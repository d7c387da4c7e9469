"""Run a test worker on a real multi-process gloo group and collect what each rank wrote.

"spawn", not "fork": a forked child inherits the parent's OpenMP/MKL thread-pool state, and touching it
(``torch.set_num_threads``) hung intermittently here. Each child re-imports torch (a few seconds), the price
of a reliable test. A hung group is killed and the test fails after ``timeout_s``.

Rendezvous through a file in the test's own directory (``file://``), not a TCP port: picking a "free" port and
releasing it before the workers bind it races with every other process on the machine.

A worker that returned normally leaves with ``os._exit(0)`` (`_run_then_exit`): its results are on disk by then, and
a normal interpreter exit ran C++ static destructors while gloo/DDP threads were still joinable, which aborted a
rank now and then ("terminate called without an active exception", SIGABRT: 2 of ~10 CI runs).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.multiprocessing as mp


def rendezvous(out_dir: Path | str) -> str:
    """``init_method`` for ``dist.init_process_group``: a file store in ``out_dir`` (unique per test)."""
    path = Path(out_dir, "rendezvous")
    if path.exists():
        raise FileExistsError(f"{path} exists: a file rendezvous must start from no file")
    return path.resolve().as_uri()


def _run_then_exit(rank: int, worker: Callable[[int, int, str, str], None], *args) -> None:
    """Run ``worker``; if it returns, flush and leave at once (an exception still propagates: non-zero exit)."""
    worker(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_group(worker: Callable[[int, int, str, str], None], world: int, out_dir: Path, timeout_s: float) -> list[dict]:
    """``worker(rank, world, init_method, out_dir)`` on ``world`` spawned processes; each writes ``rank{r}.json``."""
    ctx = mp.start_processes(
        _run_then_exit,
        args=(worker, world, rendezvous(out_dir), str(out_dir)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"DDP workers did not finish within {timeout_s} s")
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
