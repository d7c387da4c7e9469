"""The services a real cluster has beside Ray, started on this machine for ``make cluster-local`` and the tests: an
MLflow tracking server with proxied artifacts (as cluster.yaml starts it on the head) and an S3-compatible object
store (``moto_server``, from ``moto[server]`` in the ``test`` extra). Each runs as a child process on a free loopback
port and is ended (its process group) when its context exits."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pyarrow.fs as pafs

from orchestrator.errors import UserError
from orchestrator.storage.layout import MLFLOW_DB

S3_FIX = "pip install 'moto[server]' (in bcrit's test extra: make install)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, what: str, log: str | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = open(log).read()[-2000:] if log and os.path.exists(log) else ""
            raise RuntimeError(f"{what} did not answer {url}" + (f"; the end of its log:\n{tail}" if tail else ""))
        time.sleep(0.3)


def _end(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


@contextlib.contextmanager
def mlflow_server(root: str, timeout_s: float = 120) -> Iterator[str]:
    """``mlflow server`` with a SQLite store under ``root`` and artifacts proxied into ``root/artifacts``
    (``--artifacts-destination``); yields its ``http://`` URI."""
    os.makedirs(root, exist_ok=True)
    port = free_port()
    cmd = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{os.path.join(root, MLFLOW_DB)}",
        "--artifacts-destination", os.path.join(root, "artifacts"),
    ]  # fmt: skip
    log_path = os.path.join(root, "server.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait(uri + "/health", proc, "mlflow server", log_path, timeout_s)
        yield uri
    finally:
        _end(proc)


@contextlib.contextmanager
def moto_server(auth: bool = False, timeout_s: float = 60) -> Iterator[str]:
    """A fresh ``moto_server`` (an S3-compatible store in memory); yields its ``host:port``. ``auth``: it checks
    credentials as S3 does (an access key it does not know is refused)."""
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
    if exe is None:
        raise UserError(f"moto_server not found: {S3_FIX}")
    port = free_port()
    env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if auth else {})}
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        _wait(f"http://127.0.0.1:{port}/moto-api/", proc, "moto_server", None, timeout_s)
        yield f"127.0.0.1:{port}"
    finally:
        _end(proc)


CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true"}


def s3_endpoint_env(endpoint: str) -> dict[str, str]:
    """Where the store is: the endpoint in ``AWS_ENDPOINT_URL_S3`` (which pyarrow, and so Ray, honours) and the
    region. bcrit passes these from the driver to every Ray worker (trainables.trial.ensure_ray)."""
    return {"AWS_ENDPOINT_URL_S3": f"http://{endpoint}", "AWS_DEFAULT_REGION": "us-east-1"}


def s3_env(endpoint: str) -> dict[str, str]:
    """What a user of an S3-compatible server sets (docs/cluster.md): credentials (on a cluster each node has its
    own: an instance role, or its environment), region and endpoint."""
    return {**CREDENTIALS, **s3_endpoint_env(endpoint)}


def make_bucket(endpoint: str, bucket: str) -> None:
    fs = pafs.S3FileSystem(
        access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"], secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region="us-east-1", endpoint_override=endpoint, scheme="http", allow_bucket_creation=True,
    )  # fmt: skip
    fs.create_dir(bucket)
