"""The quadratic workload's learner through the trial skeleton: resuming continues the same noise stream exactly."""

from __future__ import annotations

from analysis.core import metrics as M
from trainables.nqm_trial import QuadraticConfig, train_loop
from trainables.trial import LocalSession


def evals(session) -> list[tuple[int, float]]:
    return [(r[0], r[3]) for rep in session.reports for r in rep["rows"] if r[2] == M.EVAL_LOSS]


def test_resume_is_exact_theta_and_noise_stream(tmp_path):
    cfg = QuadraticConfig(dim=8, batch_size=4, micro_batch_size=4, lr=0.3, max_steps=20, eval_every=1, report_every=5)
    straight = LocalSession()
    train_loop(cfg, straight)
    first = LocalSession(str(tmp_path))
    train_loop(QuadraticConfig.from_dict({**cfg.to_dict(), "max_steps": 10}), first)
    resumed = LocalSession(resume_from=first.checkpoints[-1])
    summary = train_loop(cfg, resumed)  # a larger budget extends the spent one
    new = [(s, v) for s, v in evals(resumed) if s > 10]
    assert evals(first) + new == evals(straight)  # bit-identical: the generator's state was restored
    assert summary["status"] == M.STATUS_BUDGET_SPENT and summary[M.STEP] == 20
    assert len({v for _, v in evals(straight)}) == 21  # the noise is live (not a deterministic decay)


def test_binned_noise_sampler_resumes_exactly_and_logs_its_allocation(tmp_path):
    import numpy as np
    import pytest

    from analysis.core.nqm_noise import bin_noise, noise_allocation
    from trainables.config import ConfigError

    base = dict(dim=8, batch_size=4, micro_batch_size=4, lr=0.3, max_steps=20, eval_every=1, report_every=5,
                timestep_bins=4, bin_noise_ratio=30.0)  # fmt: skip
    cfg = QuadraticConfig(**base, timestep_sampling="noise")
    straight, first = LocalSession(), LocalSession(str(tmp_path))
    train_loop(cfg, straight)
    train_loop(QuadraticConfig.from_dict({**cfg.to_dict(), "max_steps": 10}), first)
    resumed = LocalSession(resume_from=first.checkpoints[-1])
    train_loop(cfg, resumed)
    assert evals(first) + [(s, v) for s, v in evals(resumed) if s > 10] == evals(straight)
    uniform = LocalSession()
    train_loop(QuadraticConfig(**base), uniform)
    assert evals(uniform) != evals(straight)  # the sampler changes the draws
    p = [r[3] for rep in straight.reports for r in rep["rows"] if r[2].startswith("alloc/")]
    np.testing.assert_allclose(p, noise_allocation(bin_noise(4, 30.0), np.full(4, 0.25), 0.1))
    with pytest.raises(ConfigError, match="uniform or noise"):
        QuadraticConfig(**base, timestep_sampling="loss")
    with pytest.raises(ConfigError, match="timestep_bins >= 2"):
        QuadraticConfig(dim=8, timestep_sampling="noise")


def test_throughput_per_report_interval_is_its_examples_over_its_training_seconds():
    """`sys/examples_per_s` as trainables.sys_metrics defines it (what `bcrit recommend` reads): each report's
    interval examples over the training seconds the trial counted for it; a schedule counts each stage's B."""
    import pytest

    cfg = QuadraticConfig(dim=8, batch_size=4, micro_batch_size=4, lr=0.3, max_steps=12, eval_every=4,
                          batch_schedule=[[6, 8]], step_seconds=0.001)  # fmt: skip
    s = LocalSession()
    train_loop(cfg, s)
    reps = [r for r in s.reports if r[M.STEP] > 0]
    rates = [(r[0], r[3]) for rep in s.reports for r in rep["rows"] if r[2] == M.SYS_EXAMPLES_PER_S]
    assert [st for st, _ in rates] == [r[M.STEP] for r in reps] == [4, 8, 12]
    starts = [(0, 0.0)] + [(r[M.EXAMPLES], r["train_seconds"]) for r in reps[:-1]]
    for (e0, t0), r, (_, v) in zip(starts, reps, rates, strict=True):
        assert v == pytest.approx((r[M.EXAMPLES] - e0) / (r["train_seconds"] - t0), rel=1e-9)
    assert reps[-1][M.EXAMPLES] == 6 * 4 + 6 * 8
