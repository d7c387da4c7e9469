"""Where a sweep stores its files, checked before launch: a URI where a directory is needed (a branched study), and,
on a Ray cluster of more than one node, a directory that the other nodes do not see. (A sweep's URI storage:
orchestrator.storage.uri.)

Ray Train writes each trial's checkpoints from the node the trial runs on, into the spec's ``storage``; a path that
only the driver's node has fails at the first checkpoint upload, inside Train's retries. `check_shared_storage`
finds that before launch: the driver writes a marker file into the directory and a zero-CPU task pinned to every
other alive node (``NodeAffinitySchedulingStrategy``, hard) reads it back.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

from orchestrator.errors import UserError
from orchestrator.storage.uri import is_uri

__all__ = ["check_shared_storage", "check_storage_value", "is_uri", "read_marker"]
SHARED_FIX = "put storage on a file system every node mounts (on the ray up cluster: storage: /mnt/bcrit/runs/<name>)"
PROBE_TIMEOUT_S = 60.0


def check_storage_value(storage: str, what: str = "storage", who: str = "a branched study") -> None:
    """One UserError line for a ``storage`` URI where only a directory works (a branched study, whose branches read
    their parent's checkpoints with POSIX calls; ``bcrit train``): a URI, which ``os.path.abspath`` would turn into
    a local ``./s3:/...`` directory, is refused rather than silently written on the driver's disk."""
    if is_uri(storage):
        raise UserError(
            f"{what} {storage!r} is a URI; {who} needs a directory path every node sees (sweeps take URIs): "
            f"{SHARED_FIX}"
        )


def read_marker(path: str) -> str | None:
    """The marker's text as this node sees it (None: not visible). Runs on each node."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def check_shared_storage(sweep_dir: str, probe: Callable[[str], str | None] = read_marker) -> int:
    """On a connected Ray cluster of several alive nodes, refuse (UserError) a ``sweep_dir`` that some other node
    cannot see; returns how many other nodes were checked (0 on a one-node cluster). ``probe(marker_path)`` runs on
    each other node and returns the marker's text as it sees it (a parameter so that tests can make one node blind)."""
    # Ray: deferred, the dry run (bcrit sweep --dry-run) loads this module
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():  # Ray's state API would join whatever /tmp/ray/ray_current_cluster names, stale too
        raise RuntimeError("check_shared_storage needs a connected Ray (orchestrator.cluster.ray_start.connect) first")
    here = ray.get_runtime_context().get_node_id()
    others = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    if not others:
        return 0
    token = uuid.uuid4().hex
    marker = os.path.join(os.path.abspath(sweep_dir), f".bcrit-shared-{token}")
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    with open(marker, "w") as f:
        f.write(token)
    try:
        task = ray.remote(num_cpus=0, max_retries=0)(probe)
        refs = [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(marker)
            for n in others
        ]
        seen = ray.get(refs, timeout=PROBE_TIMEOUT_S)
    finally:
        os.remove(marker)
    blind = [n for n, s in zip(others, seen, strict=True) if s != token]
    if blind:
        n = blind[0]
        raise UserError(
            f"storage {sweep_dir!r} is not shared: node {n.get('NodeManagerAddress')} ({len(blind)} of "
            f"{len(others)} other nodes) cannot see a file the driver wrote there; {SHARED_FIX}, or a path all "
            "nodes mount"
        )
    return len(others)


def check_storage(sweep_dir: str, what: str = "storage") -> None:
    """The directory exists (created) and takes files; else one UserError line."""
    if os.path.exists(sweep_dir) and not os.path.isdir(sweep_dir):
        raise UserError(f"{what} {sweep_dir!r} is a file, not a directory; choose another storage path")
    try:
        os.makedirs(sweep_dir, exist_ok=True)
        probe = os.path.join(sweep_dir, f".bcrit-write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise UserError(f"{what} {sweep_dir!r} is not writable ({e.strerror}); choose another storage path") from None
