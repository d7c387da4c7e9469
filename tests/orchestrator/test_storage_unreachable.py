"""A storage URI that cannot be reached is one line naming the URI and the fix, within seconds
(orchestrator.storage.uri: bounded retries and timeouts, a hard deadline on the first contact), not minutes of the
cloud SDK's retries."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLOUD_ENV = ("GOOGLE_APPLICATION_CREDENTIALS", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE")


def analyze(uri: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in CLOUD_ENV and not k.startswith("AWS_ENDPOINT")}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.main", "analyze", uri],
        env={**base, "PYTHONPATH": ROOT, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.mark.timeout(120)  # a hang guard, not a timing assertion: unbounded, this waited for minutes
def test_gs_without_credentials_or_network_is_one_line():
    out = analyze("gs://some-bucket/sweep", GCE_METADATA_HOST="127.0.0.1:1", GCE_METADATA_IP="127.0.0.1:1")
    err = out.stderr.strip()
    assert out.returncode == 2, err[-2000:]
    assert err.startswith("bcrit analyze: error: storage 'gs://some-bucket/sweep'") and "\n" not in err, err
    assert "GOOGLE_APPLICATION_CREDENTIALS" in err


@pytest.mark.timeout(120)
def test_s3_endpoint_that_refuses_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = analyze(
        "s3://bucket/sweep",
        AWS_ENDPOINT_URL_S3=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="y",
        AWS_REGION="us-east-1",
    )
    err = out.stderr.strip()
    assert out.returncode == 2, err[-2000:]
    assert err.startswith("bcrit analyze: error: storage 's3://bucket/sweep'") and "\n" not in err, err
    assert "AWS_ENDPOINT_URL_S3" in err or "endpoint" in err
