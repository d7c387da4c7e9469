"""Where a command's CPU goes, by process kind: runs the command and samples /proc every 0.5 s (Linux), then prints
the CPU seconds (utime + stime) of every process that ran during it, grouped (Ray trial actors, Ray Train workers and
controllers, Train's helper actors, the ``bcrit`` drivers, Ray's own daemons), with each group's share.

    .venv/bin/python benchmarks/cpu_by_process.py -- make demo

A process that lives less than one sampling interval is missed, and a process that started before the command counts
only from the command's start. Results: benchmarks/RESULTS.md ("Where the demo's time goes").
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
GROUPS = (  # (group, substrings of the command line or process name), first match wins
    ("in-process trials (Tune trial actors)", ("ImplicitFu", "ImplicitFunc")),
    ("Ray Train workers", ("RayTrainWo",)),
    ("Ray Train controllers", ("TrainContr",)),
    ("Ray Train helper actors", ("DatasetMan", "Synchroniz", "PlacementG", "Preemption")),
    ("bcrit analyze", ("bcrit analyze",)),
    ("bcrit sweep driver", ("bcrit sweep",)),
    ("Ray daemons and idle workers", ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "ray::")),
)


def group_of(cmdline: str, comm: str) -> str:
    text = f"{cmdline} [{comm}]"
    for name, keys in GROUPS:
        if any(k in text for k in keys):
            return name
    return "other"


def snapshot() -> dict[int, tuple[str, float]]:
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            cmdline = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
            comm = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            continue
        out[int(pid)] = (group_of(cmdline, comm), (int(stat[11]) + int(stat[12])) / TICK)
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: cpu_by_process.py -- COMMAND [ARGS ...]", file=sys.stderr)
        return 2
    before = snapshot()
    last: dict[int, tuple[str, float]] = {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv[1:])
    while proc.poll() is None:
        last.update(snapshot())
        time.sleep(0.5)
    last.update(snapshot())
    wall = time.perf_counter() - t0
    totals: dict[str, float] = collections.defaultdict(float)
    for pid, (group, cpu) in last.items():
        if pid == os.getpid():
            continue
        start = before.get(pid, (group, 0.0))[1]
        totals[group] += cpu - start
    total = sum(totals.values())
    print(f"\n{'processes':<42} {'core-s':>8} {'share':>6}")
    for group, cpu in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{group:<42} {cpu:8.1f} {cpu / total:6.0%}")
    cores = os.cpu_count() or 1
    print(f"{'all':<42} {total:8.1f}   in {wall:.0f} s of wall: {total / (wall * cores):.0%} of {cores} cores")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
