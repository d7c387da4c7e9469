"""examples/sweep_script.py, run as a user runs it: the Python sweep API launches as ``bcrit sweep`` does -- a local
Ray when RAY_ADDRESS is unset, the sweep in its directory continued on a second run, a mistake in one line (the same
script against a cluster through RAY_ADDRESS: tests/orchestrator/test_cluster_nodes.py, slow)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [sys.executable, "examples/sweep_script.py", *args],
        env={**base, "PYTHONPATH": ROOT, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow  # two local Rays, ~1 min on 2 cores
def test_the_script_runs_then_continues_its_sweep(tmp_path):
    first = script("examples/quadratic.yaml", str(tmp_path / "s"))
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    n = int(first.stdout.split(" trials -> ")[0].split()[-1])
    assert f"{n} trials done" in first.stdout
    again = script("examples/quadratic.yaml", str(tmp_path / "s"))  # the CLI's --resume: not refused, not rerun
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert f"{n} trials done" in again.stdout and "new best" not in again.stdout


def test_a_dead_ray_address_is_one_line_from_the_script_too(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = script("examples/quadratic.yaml", str(tmp_path / "s"), RAY_ADDRESS=f"127.0.0.1:{port}")
    assert out.returncode == 1
    assert out.stderr.strip().startswith(f"sweep_script: error: RAY_ADDRESS=127.0.0.1:{port}"), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
