"""A batch-size schedule in a trial (``batch_schedule``, analysis.core.stages): counters, lr rule, exact resume in the
middle of a stage, the data stream, split invariance; for the noisy quadratic model and the DiT."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.core import metrics as M
from analysis.core.gns import window_b_simple
from trainables.config import ConfigError, TrialConfig
from trainables.nqm_trial import QuadraticConfig, train_loop
from trainables.trial import LocalSession, run_local


def values(reports, name) -> list[tuple[int, float]]:
    return [(r[0], r[3]) for rep in reports for r in rep["rows"] if r[2] == name]


def examples_column(reports) -> dict[int, int]:
    return {r[0]: r[1] for rep in reports for r in rep["rows"]}


# --- the noisy quadratic model ----------------------------------------------------------------------------------
NQM = dict(dim=8, batch_size=4, micro_batch_size=4, lr=0.2, max_steps=20, eval_every=1, report_every=5)
SCHEDULE = [[6, 8], [13, 16]]  # B = 4 for steps 1..6, 8 for 7..13, 16 for 14..20


def test_nqm_schedule_is_sgd_with_each_stages_batch_and_lr():
    """The trial against a brute-force loop: noise N(0, c/B(i)), lr x B(i)/B_0 (linear rule), the same generator."""
    cfg = QuadraticConfig(**NQM, batch_schedule=SCHEDULE)
    s = LocalSession()
    train_loop(cfg, s)
    h, c, theta = cfg.problem()
    rng, expect = np.random.default_rng(cfg.seed), [0.5 * float((h * theta**2).sum())]
    for i in range(20):
        b = 4 if i < 6 else 8 if i < 13 else 16
        theta = theta - cfg.lr * (b / 4) * (h * theta + np.sqrt(c / b) * rng.standard_normal(8))
        expect.append(0.5 * float((h * theta**2).sum()))
    assert [v for _, v in values(s.reports, M.EVAL_LOSS)] == pytest.approx(expect, rel=1e-12)
    last = s.reports[-1]
    assert last[M.EXAMPLES] == 6 * 4 + 7 * 8 + 7 * 16  # sum over stages, not steps x batch_size
    assert last[M.MICRO_STEP] == 6 * 1 + 7 * 2 + 7 * 4
    ex = examples_column(s.reports)
    assert [ex[n] for n in (0, 6, 7, 13, 14, 20)] == [0, 24, 32, 80, 96, 192]


def test_nqm_resume_in_the_middle_of_a_stage_is_exact(tmp_path):
    cfg = QuadraticConfig(**NQM, batch_schedule=SCHEDULE)
    straight = LocalSession()
    train_loop(cfg, straight)
    first = LocalSession(str(tmp_path))
    train_loop(QuadraticConfig.from_dict({**cfg.to_dict(), "max_steps": 10}), first)  # stops inside stage 1
    resumed = LocalSession(resume_from=first.checkpoints[-1])
    train_loop(cfg, resumed)
    joined = values(first.reports, M.EVAL_LOSS) + [(s, v) for s, v in values(resumed.reports, M.EVAL_LOSS) if s > 10]
    assert joined == values(straight.reports, M.EVAL_LOSS)
    assert resumed.reports[-1][M.EXAMPLES] == straight.reports[-1][M.EXAMPLES] == 192


def test_nqm_empty_schedule_is_the_constant_trial_bit_for_bit():
    a, b = LocalSession(), LocalSession()
    train_loop(QuadraticConfig(**NQM), a)
    train_loop(QuadraticConfig(**NQM, batch_schedule=[[10, 4]], schedule_lr_rule="sqrt"), b)  # same B: factor 1
    assert values(a.reports, M.EVAL_LOSS) == values(b.reports, M.EVAL_LOSS)
    assert a.reports[-1][M.EXAMPLES] == 80


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(batch_schedule=[[5, 6]]), "multiple of micro_batch_size x workers = 4"),
        (dict(batch_schedule=[[5, 8], [3, 16]]), "increasing"),
        (dict(schedule_lr_rule="cubic"), "schedule_lr_rule"),
        (dict(noise_unit=4, batch_schedule=[[5, 14]], micro_batch_size=2), "noise_unit 4 must divide"),
    ],
)
def test_nqm_bad_schedule_is_one_line(changes, words):
    with pytest.raises(ConfigError, match=words):
        QuadraticConfig(**{**NQM, **changes})


# --- the DiT ------------------------------------------------------------------------------------------------------
DIT = dict(preset="tiny", batch_size=8, micro_batch_size=8, eval_every=2, eval_repeats=1, timestep_bins=4,
           max_steps=6, gns_every=0, gns_window=4, batch_schedule=[[3, 16]], gns_global_every=1)  # fmt: skip


def test_dit_schedule_counters_lr_and_gns_sizes():
    s = run_local(TrialConfig(**DIT, lr=1e-3))
    last = s.reports[-1]
    assert (last[M.STEP], last[M.EXAMPLES], last[M.MICRO_STEP]) == (6, 3 * 8 + 3 * 16, 3 * 1 + 3 * 2)
    assert last[M.EPOCH] == pytest.approx(72 / 1500)
    ex = examples_column(s.reports)
    assert [ex[n] for n in range(7)] == [0, 8, 16, 24, 40, 56, 72]
    lrs = dict(values(s.reports, M.LR))
    assert [lrs[n] for n in (1, 3)] == [1e-3, 1e-3] and lrs[4] == pytest.approx(1e-3 * math.sqrt(2), rel=1e-12)
    # global GNS: halves of the micro-batch in stage 0 (A = 1), micro-batches in stage 1 (A = 2)
    assert dict(values(s.reports, M.GNS_B_BIG)) == {n: (8.0 if n <= 3 else 16.0) for n in range(1, 7)}
    assert dict(values(s.reports, M.GNS_B_SMALL)) == {n: (4.0 if n <= 3 else 8.0) for n in range(1, 7)}
    # the live B_simple is the offline re-smoothing of the logged statistics with each step's own b and B
    steps = [n for n, _ in values(s.reports, M.GNS_G2_SMALL)]
    cols = [
        [v for _, v in values(s.reports, name)] for name in (M.GNS_G2_SMALL, M.GNS_G2_BIG, M.GNS_B_SMALL, M.GNS_B_BIG)
    ]
    offline, _se = window_b_simple(steps, *cols, window=4, half=True)
    live = dict(values(s.reports, M.GNS_B_SIMPLE))
    assert live and all(v == pytest.approx(offline[steps.index(n)], rel=1e-12) for n, v in live.items())
    assert any(n > 3 for n in live)  # a window holding steps of both stages


def test_dit_resume_in_the_middle_of_a_stage_is_exact(tmp_path):
    cfg = TrialConfig(**{**DIT, "max_steps": 8, "warmup_steps": 2})
    straight = run_local(cfg)
    first = run_local(cfg.replace(max_steps=4), checkpoint_root=str(tmp_path))  # one step into stage 1
    resumed = run_local(cfg, resume_from=first.checkpoints[-1])
    for name in (M.TRAIN_LOSS, M.EVAL_LOSS, M.LR, M.GNS_B_SIMPLE):
        joined = values(first.reports, name) + [(s, v) for s, v in values(resumed.reports, name) if s > 4]
        assert joined == values(straight.reports, name), name
    assert resumed.reports[-1][M.EXAMPLES] == 3 * 8 + 5 * 16


def test_dit_schedule_reads_the_data_stream_in_order():
    """Stage 1's steps read the positions after stage 0's, so the examples seen are the same stream as a trial at
    a constant B = 8 (3 steps at 8, then each 16 = two 8s)."""
    from trainables.data import load_dataset
    from trainables.data.pipeline import MicroBatches

    cfg = TrialConfig(**DIT)
    data = load_dataset("digits", cfg.eval_size)
    sched = MicroBatches(data, 0, 8, 1, 0, 1, 8, "cpu", depth=2, stages=cfg.stages)
    const = MicroBatches(data, 0, 8, 1, 0, 1, 8, "cpu", depth=0)
    got = [sched.get(s, m)[1] for s in range(5) for m in range(1 if s < 3 else 2)]
    want = [const.get(s, 0)[1] for s in range(7)]
    sched.close()
    assert all((a == b).all() for a, b in zip(got, want, strict=True))


def test_dit_schedule_split_invariance():
    """The same schedule with micro 8 (A 1 -> 2) and micro 4 (A 2 -> 4) trains the same losses."""
    a = values(run_local(TrialConfig(**DIT)).reports, M.TRAIN_LOSS)
    b = values(run_local(TrialConfig(**{**DIT, "micro_batch_size": 4})).reports, M.TRAIN_LOSS)
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, 7))
    assert np.allclose([v for _, v in a], [v for _, v in b], rtol=1e-4)


def test_dit_bad_schedule_is_one_line():
    with pytest.raises(ConfigError, match="multiple of micro_batch_size x workers = 8"):
        TrialConfig(**{**DIT, "batch_schedule": [[3, 12]]})


def test_dit_stage_gradient_norms_match_explicit_float64():
    """A step of stage 1 (B = 8 = 2 micro-batches of 4, after 2 steps at B = 4): the collected |G_b|^2 (every
    micro-batch's) and |G_B|^2 against gradients recomputed by hand in float64 from the stage's stream positions."""
    import contextlib
    import copy

    import torch

    from trainables.data import load_dataset
    from trainables.diffusion import NUM_TIMESTEPS, make_scheduler, per_example_loss
    from trainables.presets import build_dit
    from trainables.randomness import global_batch_indices, step_draws
    from trainables.step import TrainStep

    cfg = TrialConfig(preset="tiny", batch_size=4, micro_batch_size=4, timestep_bins=4, batch_schedule=[[2, 8]])
    data, sched, step = load_dataset("digits", 297), make_scheduler(), 3
    torch.manual_seed(0)
    model = build_dit("tiny", sample_size=8, in_channels=1, num_classes=10).train()
    ref = copy.deepcopy(model).double()
    cpu = torch.device("cpu")
    stats = TrainStep(cfg, model, model, data, sched, 0, 1, cpu, contextlib.nullcontext)(step)
    idx = global_batch_indices(cfg.seed, step, 8, data.info.train_size, start=2 * 4 + 1 * 8)
    draws = step_draws(cfg.seed, step, 8, (1, 8, 8), NUM_TIMESTEPS)
    grads = []
    for sl in (slice(0, 4), slice(4, 8)):
        x, y = data.get(idx[sl])
        t, u, noise = (d[sl] for d in draws)
        y = torch.where(u < cfg.class_dropout, data.info.num_classes, y)
        loss = per_example_loss(ref, sched, x.double(), y, t, noise.double()).mean()
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(ref.parameters()))]))
    big = torch.stack(grads).mean(0)
    assert (stats.b_small, stats.b_big) == (4.0, 8)
    assert stats.g2_big == pytest.approx(float(big @ big), rel=1e-6)
    assert stats.g2_small == pytest.approx(float(torch.stack([g @ g for g in grads]).mean()), rel=1e-6)


# --- two DDP workers (spawned gloo group) -------------------------------------------------------------------------
def _ddp_worker(rank: int, world: int, init_method: str, out_dir: str) -> None:
    import json
    from pathlib import Path

    import torch.distributed as dist
    from test_resume_gns import GroupSession

    from trainables.loop import train_loop as dit_loop

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        cfg = TrialConfig(**{**DIT, "micro_batch_size": 4, "num_workers": 2})  # A = 1, then 2 (W = 2)
        session = GroupSession(rank, world, None, None)
        dit_loop(cfg, session)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(session.reports))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # a spawned 2-rank group (~15 s): slow like the other spawned-group tests (test_resume_gns.py)
def test_dit_schedule_on_two_workers_trains_like_one(tmp_path):
    """B = 8 -> 16 on W = 2 (micro 4: A = 1 -> 2, GNS from the ranks, b = micro x A) against W = 1 (micro 8)."""
    from ddp_group import run_group

    ranks = run_group(_ddp_worker, 2, tmp_path, timeout_s=240.0)
    one = run_local(TrialConfig(**DIT))
    for reports in ranks:
        two = values(reports, M.TRAIN_LOSS)
        assert np.allclose([v for _, v in two], [v for _, v in values(one.reports, M.TRAIN_LOSS)], rtol=1e-4)
        assert dict(values(reports, M.GNS_B_SMALL)) == {n: (4.0 if n <= 3 else 8.0) for n in range(1, 7)}
        assert dict(values(reports, M.GNS_B_BIG)) == {n: (8.0 if n <= 3 else 16.0) for n in range(1, 7)}
        assert reports[-1][M.EXAMPLES] == 72
