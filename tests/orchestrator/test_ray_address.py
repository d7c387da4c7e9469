"""``RAY_ADDRESS`` checked before ``ray.init`` (orchestrator.cluster.ray_address), without a Ray head: a fake GCS /
Ray Client server (grpcio generic handlers answering the methods Ray asks first), a silent TCP listener, an HTTP
server, a closed port."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from orchestrator.cli.main import main
from orchestrator.cluster.ray_address import check_ray_address
from orchestrator.errors import UserError


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_ray(request):
    """A gRPC server on 0.0.0.0 answering ``method`` (with an empty reply, or UNAUTHENTICATED when ``auth``)."""
    method, auth = request.param
    service, name = method.strip("/").split("/")

    def handler(req, ctx):
        if auth:
            ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: Authentication token is missing")
        return b""

    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {name: grpc.unary_unary_rpc_method_handler(handler)}),)
    )
    port = server.add_insecure_port("0.0.0.0:0")
    server.start()
    yield port
    server.stop(0)


GCS = "/ray.rpc.NodeInfoGcsService/GetClusterId"
CLIENT = "/ray.rpc.RayletDriver/ClusterInfo"


@pytest.mark.parametrize("fake_ray", [(GCS, False), (GCS, True)], indirect=True)
def test_a_gcs_passes_with_or_without_the_token(fake_ray):
    check_ray_address(f"127.0.0.1:{fake_ray}")


@pytest.mark.parametrize("fake_ray", [(CLIENT, False)], indirect=True)
def test_a_ray_client_server_passes_as_ray_url_and_is_named_as_host_port(fake_ray):
    check_ray_address(f"ray://127.0.0.1:{fake_ray}")
    with pytest.raises(UserError, match="a Ray Client port\\? then RAY_ADDRESS=ray://"):
        check_ray_address(f"127.0.0.1:{fake_ray}")


def test_closed_port_and_unresolvable_host_in_milliseconds():
    for address, words in [
        (f"127.0.0.1:{closed_port()}", "nothing accepts connections"),
        (f"ray://127.0.0.1:{closed_port()}", "nothing accepts connections"),
        ("no-such-host.invalid:6379", "does not resolve"),
    ]:
        t = time.monotonic()
        with pytest.raises(UserError, match=words) as e:
            check_ray_address(address)
        assert time.monotonic() - t < 2 and f"RAY_ADDRESS={address}:" in str(e.value) and "\n" not in str(e.value)


def test_a_listener_that_never_answers_is_refused_after_the_rpc_deadline():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen(8)
        t = time.monotonic()
        with pytest.raises(UserError, match="gives no Ray GCS answer within 1 s"):
            check_ray_address(f"127.0.0.1:{s.getsockname()[1]}", rpc_timeout_s=1)
        assert time.monotonic() - t < 4


def test_an_http_server_is_not_a_gcs():
    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with pytest.raises(UserError, match="accepts connections but is not a Ray GCS"):
            check_ray_address(f"127.0.0.1:{httpd.server_address[1]}")
    finally:
        httpd.shutdown()


def test_address_forms_refused_or_left_to_ray():
    with pytest.raises(UserError, match="'x' is not a port"):
        check_ray_address("head:x")
    with pytest.raises(UserError, match="expected host:port"):
        check_ray_address("head")
    check_ray_address("local")  # not a cluster: nothing to check


@pytest.mark.parametrize("command", ["sweep", "branch", "train"])
def test_every_command_that_acquires_ray_refuses_a_dead_address_in_one_line(command, monkeypatch, capsys, tmp_path):
    """The one way to acquire Ray (orchestrator.cluster.ray_start.acquire_ray) runs the check for each command."""
    import ray

    import orchestrator.cluster.ray_start as ray_start

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a fresh `bcrit` process (the suite's Ray aside)
    port = closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    spec = {
        "sweep": "examples/quadratic.yaml",
        "branch": "examples/branched-quadratic.yaml",
        "train": "examples/trial.yaml",
    }[command]
    seen = []
    real = ray_start.connect

    def connect(verbose=False):
        seen.append(True)
        return real(verbose)

    monkeypatch.setattr(ray_start, "connect", connect)
    args = [command, spec, "--set", f"storage={tmp_path / 'out'}"]
    if command == "train":
        args = [command, spec, "--storage", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert seen, "the command did not acquire Ray through acquire_ray"
    assert err.startswith(f"bcrit {command}: error: RAY_ADDRESS=127.0.0.1:{port}") and "\n" not in err, err
