"""``RAY_ADDRESS`` that nothing answers at: refused in one line within seconds, before ``ray.init`` (which retries a
dead GCS for minutes), for every command that acquires Ray."""

from __future__ import annotations

import socket

import pytest

from orchestrator.cli.main import main
from orchestrator.cluster.ray_address import CLIENT_PORT, check_reachable, host_port
from orchestrator.errors import UserError


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "address, expected",
    [
        ("10.0.0.1:6379", ("10.0.0.1", 6379)),
        ("head", ("head", 6379)),
        ("ray://head", ("head", CLIENT_PORT)),
        ("ray://head:20001", ("head", 20001)),
        ("[::1]:6380", ("::1", 6380)),
        ("auto", None),
        ("local", None),
    ],
)
def test_host_port_of_each_address_form(address, expected):
    assert host_port(address) == expected


def test_a_port_that_is_not_a_number_is_one_line():
    with pytest.raises(UserError, match="'x' is not a port"):
        host_port("head:x")


def test_nothing_listening_is_refused_with_the_address_and_the_fix():
    port = closed_port()
    with pytest.raises(UserError) as e:
        check_reachable(f"127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in str(e.value) and "RAY_ADDRESS" in str(e.value) and "ray start --head" in str(e.value)


def test_an_unresolvable_host_is_refused():
    with pytest.raises(UserError, match="does not resolve"):
        check_reachable("no-such-host.invalid:6379")


def test_a_listening_port_passes():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        check_reachable(f"127.0.0.1:{s.getsockname()[1]}")


@pytest.mark.parametrize("command", ["sweep", "branch", "train"])
def test_every_command_that_acquires_ray_refuses_a_dead_address_in_one_line(command, monkeypatch, capsys, tmp_path):
    """The one way to acquire Ray (orchestrator.cluster.ray_start.acquire_ray) runs the check for each command."""
    import orchestrator.cluster.ray_start as ray_start

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
