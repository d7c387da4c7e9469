"""``RAY_ADDRESS`` checked before ``ray.init``, in seconds: an address that is not a Ray head is one line naming it
and the fix.

Ray's ``ray.init(address=host:port)`` makes up to 20 GCS-client attempts (``ray/_private/node.py``
``_init_gcs_client``), each ~41 s against a dead, closed or unresolvable address, or a port that is not a GCS: ~14
minutes of C++ warnings, and its SIGTERM handler runs only between attempts. Ray's own timeouts
(``RAY_py_gcs_connect_timeout_s``, ...) are read when ``ray._raylet`` is imported, too late for ``connect()``. So:
dial what Ray will dial (``auto`` resolved as Ray does, ``localhost`` at this node's IP), with short timeouts, and ask
the service there the first thing Ray asks (one gRPC call with a deadline): only a Ray GCS (for ``ray://``, a Ray
Client server) answers it. A bare TCP check is not enough: another service's port, or an egress proxy that accepts
every outbound connection, passes it and ``ray.init`` still retries for minutes.
"""

from __future__ import annotations

import os
import socket
import threading

from orchestrator.errors import UserError

RAY_CLIENT_PORT = 10001  # Ray Client's default (ray://host)
CHECK_TIMEOUT_S = 3.0  # DNS, TCP connect
RPC_TIMEOUT_S = 10.0  # the one gRPC call: a busy GCS answers GetClusterId in milliseconds; a silent port never does
FIX = "is the cluster running (`ray start --head`, `ray up cluster.yaml`)? Or fix or unset RAY_ADDRESS"


def ray_dial_target(address: str) -> tuple[str, int, str] | None:
    """``(host, port, what)`` that ``ray.init(address=address)`` will dial, or None when there is nothing to check
    (``local``; a ``<plugin>://`` client address other than ``ray://``). ``auto`` is resolved the way Ray does it
    (a GCS process on this machine, else ``/tmp/ray/ray_current_cluster`` -- which a crashed head leaves behind,
    so it is dialled too); none found is Ray's own immediate ConnectionError, re-raised as one line here.
    ``localhost``/``127.0.0.1`` are dialled as Ray does: at this node's IP (services.resolve_ip_for_localhost)."""
    # Ray: deferred, the dry run (bcrit sweep --dry-run) loads this module
    from ray._common.network_utils import parse_address
    from ray._private import services

    a = address.strip()
    if a in ("", "local"):
        return None
    if "://" in a:
        if not a.startswith("ray://"):
            return None  # another client plugin (e.g. anyscale://): not ours to second-guess
        hostport = a[len("ray://") :].split("/", 1)[0]
        parsed = parse_address(hostport)  # "[v6]:port", "host:port"; None when no port
        if parsed is None:
            host, port = hostport.strip("[]"), str(RAY_CLIENT_PORT)
        else:
            host, port = parsed
        what = "Ray Client server"
    else:
        try:
            canon = services.canonicalize_bootstrap_address(a)  # "auto" -> found address; localhost -> node IP
        except ConnectionError:  # "auto" and no Ray on this machine: Ray says so at once
            raise UserError(f"RAY_ADDRESS={address}: no running Ray cluster found on this machine; {FIX}") from None
        except ValueError:
            raise UserError(f"RAY_ADDRESS={address}: expected host:port (e.g. 10.0.0.1:6379), auto or "
                            "ray://host:10001") from None  # fmt: skip
        if canon is None:
            return None
        host, port = parse_address(canon)
        what = "Ray GCS"
    try:
        return host, int(port), what
    except ValueError:
        raise UserError(f"RAY_ADDRESS={address}: {port!r} is not a port; expected host:port (e.g. 10.0.0.1:6379)"
                        ) from None  # fmt: skip


def _resolve(host: str, port: int, timeout_s: float):
    """getaddrinfo bounded by ``timeout_s`` (create_connection's timeout does not cover DNS)."""
    box: dict = {}

    def work():
        try:
            box["r"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            box["e"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"resolving {host!r} took over {timeout_s:g} s")
    if "e" in box:
        raise box["e"]
    return box["r"]


def _grpc_answer(target: str, method: str, timeout_s: float):
    """(code, details) of one unary call with an empty request: a plaintext gRPC exchange bounded by ``timeout_s``."""
    # grpc: deferred, the dry run (bcrit sweep --dry-run) loads this module
    import grpc  # ray[default] brings grpcio

    channel = grpc.insecure_channel(target)
    try:
        channel.unary_unary(method)(b"", timeout=timeout_s)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    finally:
        channel.close()


def check_ray_address(address: str, timeout_s: float = CHECK_TIMEOUT_S, rpc_timeout_s: float = RPC_TIMEOUT_S) -> None:
    """One UserError line, within ``2 x timeout_s + rpc_timeout_s`` at worst (milliseconds for a refused port),
    when what ``RAY_ADDRESS`` names is not a Ray head: the host
    does not resolve, nothing accepts a TCP connection there, or what does is not a Ray GCS (``ray://``: not a Ray
    Client server). The service is asked what Ray asks first (GCS: ``GetClusterId``; Ray Client: ``ClusterInfo``):
    an answer, or a refusal for a missing/wrong token, is a Ray head (the token is ``ray.init``'s to check). With
    ``RAY_USE_TLS`` on, only the TCP connection is checked."""
    # grpc: deferred, the dry run (bcrit sweep --dry-run) loads this module
    import grpc
    from ray._common.network_utils import build_address, parse_address

    target = ray_dial_target(address)
    if target is None:
        return
    host, port, what = target
    where = build_address(host, port)
    shown = where
    given = parse_address(address.strip()) if "://" not in address else None
    if address.strip() == "auto":
        note = "; the address of the Ray last started on this machine"
    elif given and given[0] != host:
        note = f"; Ray dials {given[0]} at this node's IP, {host}"
    else:
        note = ""
    try:
        infos = _resolve(host, port, timeout_s)
    except socket.gaierror:
        raise UserError(f"RAY_ADDRESS={address}: the host {host!r} does not resolve; {FIX}") from None
    except TimeoutError:
        raise UserError(f"RAY_ADDRESS={address}: the host {host!r} did not resolve within {timeout_s:g} s (DNS); "
                        f"{FIX}") from None  # fmt: skip
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(timeout_s)
                s.connect(sockaddr)
            break
        except OSError as e:
            last = e
    else:
        why = "no answer" if isinstance(last, (TimeoutError, socket.timeout)) else (
            (getattr(last, "strerror", None) or type(last).__name__).lower())  # fmt: skip
        raise UserError(f"RAY_ADDRESS={address}: nothing accepts connections at {shown} ({why}{note}); {FIX}") from None
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return
    method = ("/ray.rpc.RayletDriver/ClusterInfo" if what == "Ray Client server"
              else "/ray.rpc.NodeInfoGcsService/GetClusterId")  # fmt: skip
    code, details = _grpc_answer(where, method, rpc_timeout_s)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        raise UserError(f"RAY_ADDRESS={address}: {shown} accepts connections but gives no {what} answer within "
                        f"{rpc_timeout_s:g} s (a head still starting? try again); {FIX}")  # fmt: skip
    if code in (grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return
    grpc_server = code == grpc.StatusCode.UNIMPLEMENTED and "http2 header" not in details  # not an HTTP 404
    if grpc_server and what == "Ray GCS":
        hint = f"; a Ray Client port? then RAY_ADDRESS=ray://{where}"
    elif grpc_server:
        hint = f"; the head's GCS port? then RAY_ADDRESS={where} (no ray://)"
    else:
        hint = "; the head's GCS is its --port (6379 by default), Ray Client ray://<head>:10001"
    first = details.strip().splitlines()[0] if details.strip() else code.name
    first = first.rsplit("last error: ", 1)[-1][:100]
    raise UserError(f"RAY_ADDRESS={address}: {shown} accepts connections but is not a {what} ({first}){hint}")
