"""Trial checkpoints (`trainables.checkpoint`): rank 0's state plus every rank's own RNG states, restored per rank."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from trainables import checkpoint


def _draws() -> tuple:
    """One draw from each global RNG a trial might use."""
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]  # noqa: NPY002


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)  # noqa: NPY002
    random.seed(seed)


def test_each_rank_restores_its_own_rng_states(tmp_path) -> None:
    """Ranks write into one directory (as Ray Train merges them); loading as rank r continues rank r's streams."""
    expected = {}
    for rank in (0, 1, 2):
        _seed_all(100 + rank)  # per-rank RNG, as each worker has
        _draws()  # advance a little: the saved state is not a freshly seeded one
        checkpoint.save(str(tmp_path), rank, {"step": 7, "who": "rank0"} if rank == 0 else None)
        expected[rank] = _draws()  # what rank `rank` draws next
    for rank in (2, 0, 1):
        _seed_all(999)  # whatever state the restarted process has
        state = checkpoint.load(str(tmp_path), rank)
        assert state == {"step": 7, "who": "rank0"}  # every rank gets rank 0's state
        assert _draws() == expected[rank], rank
    assert {p.name for p in tmp_path.iterdir()} == {checkpoint.STATE_FILE, *(checkpoint.rng_file(r) for r in range(3))}


def test_a_rank_without_its_rng_file_keeps_its_state(tmp_path) -> None:
    checkpoint.save(str(tmp_path), 0, {"step": 1})
    _seed_all(5)
    before = _draws()
    _seed_all(5)
    assert checkpoint.load(str(tmp_path), 3) == {"step": 1}  # rank 3 wrote nothing (e.g. W grew): RNG untouched
    assert _draws() == before


def test_not_a_checkpoint_is_one_clear_error(tmp_path) -> None:
    checkpoint.save(str(tmp_path / "only_rng"), 1, None)  # a rank > 0 alone writes no state
    with pytest.raises(FileNotFoundError, match="not a bcrit trial checkpoint"):
        checkpoint.load(str(tmp_path / "only_rng"), 1)
    with pytest.raises(FileNotFoundError, match="not a bcrit trial checkpoint"):
        checkpoint.load(str(tmp_path / "missing"), 0)


def test_state_round_trips_tensors(tmp_path) -> None:
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "last": {"eval/loss": 0.5}, "first_eval": None}
    checkpoint.save(str(tmp_path / "nested" / "dir"), 0, state)  # creates the directory
    back = checkpoint.load(str(tmp_path / "nested" / "dir"), 0)
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and back["last"] == state["last"]
    assert back["first_eval"] is None


@pytest.mark.gpu
def test_cuda_rng_restored_and_cpu_checkpoints_load_on_gpu(tmp_path, monkeypatch) -> None:
    """(Runs only with CUDA; not run on the CPU machine this was written on.)"""
    torch.cuda.manual_seed_all(3)
    torch.rand(2, device="cuda")
    checkpoint.save(str(tmp_path / "gpu"), 0, {"step": 0})
    expected = torch.rand(4, device="cuda").tolist()
    torch.cuda.manual_seed_all(99)
    checkpoint.load(str(tmp_path / "gpu"), 0)
    assert torch.rand(4, device="cuda").tolist() == expected
    with monkeypatch.context() as m:  # a checkpoint written on a CPU-only machine has no CUDA RNG state
        m.setattr(torch.cuda, "is_available", lambda: False)
        checkpoint.save(str(tmp_path / "cpu"), 0, {"step": 1})
    before = torch.cuda.get_rng_state_all()
    assert checkpoint.load(str(tmp_path / "cpu"), 0) == {"step": 1}  # loads on a GPU machine, CUDA RNG untouched
    assert all(torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), before, strict=True))
