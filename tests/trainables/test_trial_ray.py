"""The trial inside Ray Train: 2 DDP workers (gloo), and the in-process num_workers=0 path."""

import os

import pytest
import torch

from analysis.core import metrics as M
from trainables.config import TrialConfig
from trainables.trial import build_trainer, run_local

pytestmark = pytest.mark.ray

BASE = dict(preset="tiny", batch_size=16, max_steps=3, eval_every=3, eval_repeats=1)


def _final_params(checkpoint_dir):
    state = torch.load(os.path.join(checkpoint_dir, "state.pt"), weights_only=True)
    return {k: v.double() for k, v in state["model"].items()}


def test_two_workers_give_the_same_update_as_one(ray_local, tmp_path):
    # B = 16 as micro 8 x A 1 x W 2 (DDP) vs micro 16 x A 1 x W 1 (in-process)
    single = run_local(TrialConfig(**BASE, micro_batch_size=16), checkpoint_root=str(tmp_path / "single"))
    cfg = TrialConfig(**BASE, micro_batch_size=8, num_workers=2)
    result = build_trainer(cfg, name="w2", storage_path=str(tmp_path)).fit()
    summary = result.return_value
    assert summary["status"] == M.STATUS_BUDGET_SPENT and summary[M.STEP] == 3 and summary[M.EXAMPLES] == 48
    # W x A = 2: small = per-rank gradient (b=8), big = all-reduced (B=16), at every step
    assert summary["gns_global"].startswith("on: ranks, every step")
    with result.checkpoint.as_directory() as d:
        assert {"state.pt", "rng_rank0.pt", "rng_rank1.pt"} <= set(os.listdir(d))  # per-rank RNG states merged
        p2 = _final_params(d)
    p1 = _final_params(single.checkpoints[-1])
    diff = max((p1[k] - p2[k]).abs().max().item() for k in p1)
    assert diff < 1e-4, diff  # < 3% of one Adam step (lr 1e-3): float summation order only
    # the same held-out evaluation on both sides (CRN), up to the same float tolerance
    assert summary["last"][M.EVAL_LOSS] == pytest.approx(single.summary["last"][M.EVAL_LOSS], rel=1e-3)
    # the system metrics of a Ray Train worker: the interval's rate, its own process's peak RSS (torch: > 0.1 GiB)
    assert summary["last"][M.SYS_EXAMPLES_PER_S] > 0 and summary["last"][M.SYS_PEAK_MEM_GB] > 0.1


def test_in_process_trainer(ray_local, tmp_path):
    cfg = TrialConfig(**BASE, micro_batch_size=8)  # A = 2 in one process
    result = build_trainer(cfg, name="w0", storage_path=str(tmp_path)).fit()
    assert result.return_value["status"] == M.STATUS_BUDGET_SPENT
    assert result.return_value[M.MICRO_STEP] == 6
