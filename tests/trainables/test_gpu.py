"""On a GPU: the trial runs with bf16 autocast and CUDA tensors (skipped without CUDA)."""

import pytest

from analysis import metrics as M
from trainables.config import TrialConfig
from trainables.trial import run_local

pytestmark = pytest.mark.gpu


def test_tiny_trial_on_gpu_bf16():
    cfg = TrialConfig(preset="tiny", batch_size=32, micro_batch_size=16, max_steps=10, eval_every=5, use_gpu=True)
    s = run_local(cfg)
    assert s.reports[-1]["status"] == M.STATUS_BUDGET_SPENT
    assert s.summary["gns_global"] == "on"
    assert s.summary["last"][M.EVAL_LOSS] < s.reports[0][M.EVAL_LOSS]
