"""A real S3-compatible server for the tests: ``moto_server`` (PyPI ``moto[server]``) in a child process on a free
loopback port, and the environment that points pyarrow (and so Ray Tune / Train) at it."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server(auth: bool = False):
    """Yields ``host:port`` of a fresh ``moto_server`` (``auth``: moto checks credentials, as S3 does: an access
    key it does not know is refused)."""
    port = free_port()
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
    assert exe, "moto_server not found: pip install 'moto[server]' (the test extra)"
    env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if auth else {})}
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def s3_env(endpoint: str) -> dict[str, str]:
    """What a user of an S3-compatible server sets (docs/cluster.md): credentials, region, and the endpoint in
    ``AWS_ENDPOINT_URL_S3`` (which pyarrow, and so Ray, honours)."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": f"http://{endpoint}",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def make_bucket(endpoint: str, bucket: str) -> None:
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True)
    fs.create_dir(bucket)
