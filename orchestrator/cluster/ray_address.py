"""``RAY_ADDRESS`` checked before ``ray.init``: an address nothing listens on is refused in one line within seconds
(Ray itself retries a dead GCS for minutes, printing only its own warnings)."""

from __future__ import annotations

import socket

from orchestrator.errors import UserError

CONNECT_TIMEOUT_S = 3.0
CLIENT_PORT = 10001  # Ray Client's default (ray://host)
FIX = "is the cluster running (`ray start --head`, `ray up cluster.yaml`)? Or fix or unset RAY_ADDRESS"


def host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``RAY_ADDRESS`` to probe; None for ``auto``/``local`` (Ray finds the running cluster
    itself and fails fast when there is none). ``ray://host[:port]`` is Ray Client (port 10001 by default);
    ``[v6]:port`` is an IPv6 address."""
    a = address.strip()
    if a in ("auto", "local", ""):
        return None
    default = 6379
    if a.startswith("ray://"):
        a, default = a[len("ray://") :], CLIENT_PORT
    elif "://" in a:
        a = a.split("://", 1)[1]
    a = a.split("/", 1)[0]
    if a.startswith("["):
        host, _, rest = a[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif a.count(":") == 1:
        host, port = a.split(":")
    else:
        host, port = a, ""
    try:
        return host, int(port) if port else default
    except ValueError:
        raise UserError(
            f"RAY_ADDRESS={address}: {port!r} is not a port; expected host:port (e.g. 10.0.0.1:6379)"
        ) from None


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """One UserError line when nothing accepts a TCP connection at ``address`` within ``timeout_s``."""
    hp = host_port(address)
    if hp is None:
        return
    host, port = hp
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except socket.gaierror:
        raise UserError(f"RAY_ADDRESS={address}: the host {host!r} does not resolve; {FIX}") from None
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__).lower()
        raise UserError(f"RAY_ADDRESS={address}: nothing accepts connections at {host}:{port} ({why}); {FIX}") from None
