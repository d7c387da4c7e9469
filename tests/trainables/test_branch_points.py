"""A DiT branch starts from the reference's kept checkpoint: same weights (same held-out loss at its step 0),
optimizer state carried on (Adam's step count continues), its own learning rate; counters from 0."""

from __future__ import annotations

import os

import torch

from analysis.core import metrics as M
from trainables.branch_points import kept_path
from trainables.checkpoint import STATE_FILE
from trainables.config import TrialConfig
from trainables.trial import run_local

BASE = dict(preset="tiny", dataset="digits", eval_size=32, eval_repeats=1, timestep_bins=2, gns=False, gns_every=0)


def _rows(session, name):
    return [(r[0], r[3]) for rep in session.reports for r in rep["rows"] if r[2] == name]


def test_dit_branch_starts_from_kept_checkpoint(tmp_path):
    keep = str(tmp_path / "kept")
    ref = run_local(
        TrialConfig(
            **BASE,
            batch_size=8,
            micro_batch_size=8,
            lr=2e-3,
            max_steps=6,
            eval_every=3,
            checkpoint_every=3,
            keep_dir=keep,
            keep_steps=[3, 6],
        )
    )
    assert sorted(os.listdir(keep)) == ["step00000003", "step00000006"]
    ref_eval = dict(_rows(ref, M.EVAL_LOSS))
    branch = run_local(
        TrialConfig(
            **BASE,
            batch_size=16,
            micro_batch_size=16,
            lr=2e-3 * 2**0.5,
            max_steps=2,
            eval_every=1,
            init_from=kept_path(keep, 3),
        ),
        checkpoint_root=str(tmp_path / "branch"),
    )
    ev = dict(_rows(branch, M.EVAL_LOSS))
    assert ev[0] == ref_eval[3]  # the reference's weights at step 3
    assert [v for _, v in _rows(branch, M.LR)] == [2e-3 * 2**0.5] * 2  # the branch's own lr
    assert branch.summary[M.STEP] == 2 and branch.summary[M.EXAMPLES] == 32  # counters from the branch point
    state = torch.load(os.path.join(branch.checkpoints[-1], STATE_FILE), weights_only=True)
    steps = {int(s["step"]) for s in state["optimizer"]["state"].values()}
    assert steps == {3 + 2}  # Adam's moments and step count came from the checkpoint


def test_start_dit_sets_the_branch_lr_over_the_checkpoints(tmp_path):
    from trainables.branch_points import start_dit

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 7}, tmp_path / STATE_FILE)
    fresh = torch.nn.Linear(3, 2)
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=5e-3)
    assert start_dit(str(tmp_path), 5e-3, fresh, opt2, None) == 7
    assert [g["lr"] for g in opt2.param_groups] == [5e-3]  # not the checkpoint's 1e-3
    assert torch.equal(fresh.weight, model.weight)
    assert int(opt2.state[fresh.weight]["step"]) == 1
