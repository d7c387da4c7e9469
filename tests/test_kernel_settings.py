"""`make test-kernels` really changes the kernels (docs/testing.md): each setting it passes took effect, so a
`numerics` test that holds on one CPU's kernels only can fail there (skipped under `make test`, which sets none)."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.numerics


@pytest.mark.skipif("BCRIT_TEST_THREADS" not in os.environ, reason="set by `make test-kernels`")
def test_thread_count_was_applied() -> None:
    assert torch.get_num_threads() == int(os.environ["BCRIT_TEST_THREADS"])


@pytest.mark.skipif("BCRIT_TEST_MKLDNN" not in os.environ, reason="set by `make test-kernels`")
def test_onednn_setting_was_applied() -> None:
    assert torch.backends.mkldnn.enabled == (os.environ["BCRIT_TEST_MKLDNN"] not in ("0", "false", "off"))


@pytest.mark.skipif(os.environ.get("ATEN_CPU_CAPABILITY") != "default", reason="set by `make test-kernels`")
def test_aten_runs_its_portable_kernels() -> None:
    assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"


@pytest.mark.skipif("NPY_DISABLE_CPU_FEATURES" not in os.environ, reason="set by `make test-kernels`")
def test_numpy_dispatch_was_turned_off() -> None:
    from numpy._core._multiarray_umath import __cpu_features__

    off = os.environ["NPY_DISABLE_CPU_FEATURES"].split()
    assert not [f for f in off if __cpu_features__.get(f)], off
