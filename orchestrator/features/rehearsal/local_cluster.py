"""A Ray cluster of several nodes on this machine, made of real ``ray start`` processes (a head and worker
raylets), for ``make cluster-local`` (orchestrator.features.rehearsal.rehearse) and the multi-node tests. Each node is
one ``ray start --block`` process: ending it (SIGTERM, or SIGKILL as a lost machine) ends that node's raylet and
workers through Ray's reaper, and nothing else -- unlike ``ray stop``, which ends every Ray process of the machine,
other users' clusters included.

Ray 2.60's head turns token authentication on and writes the token to ``~/.ray/auth_token``; every later node and
driver joins with ``RAY_AUTH_MODE=token`` (:meth:`LocalCluster.env`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

READY = "block forever"  # what `ray start --block` prints once its node is registered with the GCS


@dataclass
class Node:
    proc: subprocess.Popen
    log: str
    resources: dict[str, float]

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class LocalCluster:
    """``port``: the head's GCS port (other ports derive from it, so clusters on distinct ports do not collide);
    ``head_cpus``: the head's logical CPUs (Tune drivers); worker nodes are added with :meth:`add_worker`."""

    port: int = 6421
    head_cpus: int = 2
    object_store_bytes: int = 100_000_000
    logs: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="bcrit-cluster-"))
    nodes: list[Node] = field(default_factory=list)
    node_env: dict[str, str] = field(default_factory=dict)  # what every node's processes have beside os.environ

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process joining this cluster (driver or node)."""
        env = {**os.environ, "RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token", **extra}
        env.setdefault("RAY_raylet_start_wait_time_s", "120")  # a loaded machine registers nodes slowly
        return env

    def _ports(self, i: int) -> list[str]:
        base = 20000 + (self.port % 100) * 400 + i * 40  # worker ports, distinct per node and per cluster
        return [
            f"--min-worker-port={base}",
            f"--max-worker-port={base + 30}",
            f"--dashboard-agent-listen-port={base + 31}",
            f"--dashboard-agent-grpc-port={base + 32}",
            f"--runtime-env-agent-port={base + 33}",
            f"--metrics-export-port={base + 34}",
            f"--node-manager-port={base + 35}",
            f"--object-manager-port={base + 36}",
        ]

    def _start(self, args: list[str], resources: dict[str, float], timeout_s: float) -> Node:
        i = len(self.nodes)
        os.makedirs(self.logs, exist_ok=True)
        log = os.path.join(self.logs, f"node{i}.log")
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        cmd = [ray, "start", "--block", "--disable-usage-stats", f"--object-store-memory={self.object_store_bytes}"]
        with open(log, "w") as out:
            proc = subprocess.Popen([*cmd, *args, *self._ports(i)], stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env(**self.node_env), start_new_session=True)  # fmt: skip
        node = Node(proc, log, resources)
        self.nodes.append(node)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(log) as f:
                if READY in f.read():
                    return node
            if not node.alive():
                break
            time.sleep(0.5)
        with open(log) as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"Ray node {i} did not start (log {log}):\n{tail}")

    def start_head(self, timeout_s: float = 120) -> Node:
        args = ["--head", f"--port={self.port}", f"--num-cpus={self.head_cpus}", "--num-gpus=0",
                f"--dashboard-port={self.port + 1900}", f"--ray-client-server-port={self.port + 3900}"]  # fmt: skip
        return self._start(args, {"CPU": float(self.head_cpus)}, timeout_s)

    def add_worker(self, cpus: int = 1, resources: dict[str, float] | None = None, timeout_s: float = 120) -> Node:
        res = dict(resources or {})
        args = [f"--address={self.address}", f"--num-cpus={cpus}", "--num-gpus=0"]
        if res:
            args.append(f"--resources={json.dumps(res)}")
        return self._start(args, {"CPU": float(cpus), **res}, timeout_s)

    def kill(self, node: Node, sig: int = signal.SIGKILL) -> None:
        """End one node: SIGKILL is a machine lost (its reaper then ends the raylet and its workers)."""
        if node.alive():
            node.proc.send_signal(sig)
        node.proc.wait(60)

    def shutdown(self) -> None:
        """End every node this object started (workers first), nothing else. A head's ``ray start --block`` may
        outlive SIGTERM: after 10 s it gets SIGKILL, and its reaper ends the node's processes."""
        for node in reversed(self.nodes):
            if node.alive():
                node.proc.send_signal(signal.SIGTERM)
        for node in reversed(self.nodes):
            try:
                node.proc.wait(10)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(10)
        self.nodes.clear()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
