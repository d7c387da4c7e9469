"""A trial packed on a GPU (``gpus_per_worker < 1``) caps its own CUDA memory at its share, and a CUDA out-of-memory
error inside it is one line naming the share and the fix (trainables.trial.gpu_share). CUDA is mocked: these run on
a CPU; tests/trainables/test_gpu.py runs the real cap on a GPU."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from trainables import trial
from trainables.config import TrialConfig
from trainables.trial import GpuShareError, cap_gpu_memory, gpu_share

GIB = 2**30
PACKED = dict(batch_size=32, micro_batch_size=16, lr=1e-3, use_gpu=True, gpus_per_worker=0.25)


@pytest.fixture
def cuda():
    """A CUDA that is there (device 0 current, 16 GiB) as far as trainables.trial asks; the cap recorded."""
    with (
        mock.patch.object(torch.cuda, "is_available", return_value=True),
        mock.patch.object(torch.cuda, "current_device", return_value=0),
        mock.patch.object(torch.cuda, "set_per_process_memory_fraction") as cap,
        mock.patch.object(torch.cuda, "get_device_properties", return_value=SimpleNamespace(total_memory=16 * GIB)),
    ):
        yield cap


def oom() -> torch.cuda.OutOfMemoryError:
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_a_share_caps_the_process_on_its_own_cuda_device(cuda):
    assert cap_gpu_memory(torch.device("cuda:1"), 0.25) is True
    cuda.assert_called_once_with(0.25, 1)
    cuda.reset_mock()
    assert cap_gpu_memory("cuda", 0.5) is True  # no index: the current device
    cuda.assert_called_once_with(0.5, 0)


def test_no_cap_for_a_whole_gpu_on_a_cpu_or_without_cuda(cuda):
    assert cap_gpu_memory("cuda:0", 1.0) is False  # a whole GPU: nothing to share
    assert cap_gpu_memory("cpu", 0.25) is False
    with mock.patch.object(torch.cuda, "is_available", return_value=False):
        assert cap_gpu_memory("cuda:0", 0.25) is False
    cuda.assert_not_called()
    with gpu_share(1.0, "cuda:0"), gpu_share(0.25, torch.device("cpu")):
        pass
    cuda.assert_not_called()


def test_out_of_memory_within_the_share_is_one_line(cuda):
    with pytest.raises(GpuShareError) as e, gpu_share(0.25, "cuda:0") as capped:
        assert capped
        raise oom()
    msg = str(e.value)
    assert msg == (
        "CUDA out of memory within this trial's share of the GPU, gpus_per_worker 0.25 (4 of 16 GiB): lower "
        "micro_batch_size (more accumulation, the same batch_size) or batch_size, or raise gpus_per_worker"
    )
    assert len(msg.splitlines()) == 1
    assert cuda.call_args_list == [mock.call(0.25, 0), mock.call(1.0, 0)]  # capped, then the cap undone


def test_other_errors_and_uncapped_trials_keep_their_own_exception(cuda):
    with pytest.raises(KeyError), gpu_share(0.25, "cuda:0"):
        raise KeyError("not memory")
    with pytest.raises(torch.cuda.OutOfMemoryError), gpu_share(1.0, "cuda:0"):
        raise oom()  # a whole GPU: its own OOM, no share to blame
    with pytest.raises(torch.cuda.OutOfMemoryError), gpu_share(0.25, "cpu"):
        raise oom()


def test_an_out_of_memory_behind_a_wrapper_is_found(cuda):
    wrapper = RuntimeError("worker failed")
    wrapper.worker_failures = {0: oom()}  # as Ray Train's TrainingFailedError holds a worker's exception
    with pytest.raises(GpuShareError, match="gpus_per_worker 0.5"), gpu_share(0.5, "cuda:0"):
        raise wrapper
    assert trial.gpu_share_oom(RuntimeError("other"), 0.5, "cuda:0") is None


def test_run_local_and_train_workers_run_within_their_share(cuda, monkeypatch):
    def loop(cfg, session):
        assert cuda.call_args_list == [mock.call(0.25, 0)]  # capped before the loop builds anything
        raise oom()

    monkeypatch.setattr(trial, "train_loop", loop)
    with pytest.raises(GpuShareError, match="gpus_per_worker 0.25"):
        trial.run_local(TrialConfig(**PACKED))
    cuda.reset_mock()
    monkeypatch.setattr(trial, "RaySession", lambda *a: SimpleNamespace(device=torch.device("cuda:0")))
    with pytest.raises(GpuShareError, match="gpus_per_worker 0.25"):
        trial.train_func({"trial": TrialConfig(**PACKED).to_dict()}, loop=loop)
    cuda.reset_mock()
    monkeypatch.setattr(trial, "RaySession", lambda *a: SimpleNamespace(device=torch.device("cpu")))
    assert trial.train_func({"trial": TrialConfig(**PACKED).to_dict()}, loop=lambda c, s: "done") == "done"
    cuda.assert_not_called()  # a CPU worker: nothing capped
