"""The noisy quadratic model's expected loss under a batch-size schedule, in closed form (extends
tests.oracles.nqm).

Within a stage of batch size ``B_k`` and learning rate ``lr_k`` the second moments follow the linear recursion of
:mod:`tests.oracles.nqm` (``m' = r m + q``, ``r = (1 - lr_k h)²``, ``q = lr_k² c / B_k``), so from the stage's
first step
``s_k`` on

    m(t) = m*_k + r^(t - s_k) (m(s_k) - m*_k),      m*_k = lr_k c / (B_k h (2 - lr_k h))

and the next stage starts from ``m(s_{k+1})``: the expected loss ``½ Σ h m(t)`` of a piecewise-constant schedule
is exact at every integer step (``analysis.core.stages.BatchStages`` holds the stages; the lr of each stage is given).
Steps to a target are interpolated between integer steps like :func:`analysis.fits.steps.steps_to_target`, and the
examples at that crossing between the examples of its two integer steps, as the runs tables' ``examples`` column
is (``measured_to_target`` in tests/analysis/test_schedule.py).
"""

from __future__ import annotations

import numpy as np

from analysis.core.stages import BatchStages

CHUNK = 4096  # integer steps evaluated at once (memory: dim x CHUNK floats)


def _moments(h: np.ndarray, c: np.ndarray, m0: np.ndarray, lr: float, B: float, t: np.ndarray) -> np.ndarray:
    """Second moments ``(d, T)`` after ``t`` steps (``t >= 0``) of one stage started at ``m0``."""
    r = ((1.0 - lr * h) ** 2)[:, None]  # (d, 1)
    q = (lr**2 * c / B)[:, None]
    tt = np.asarray(t, dtype=np.float64)[None, :]  # (1, T)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        flat = np.isclose(r, 1.0, rtol=0.0, atol=1e-15)
        m_star = np.where(flat, 0.0, q / np.where(flat, 1.0, 1.0 - r))
        rest = np.where(m0[:, None] == m_star, 0.0, np.exp(tt * np.log(np.maximum(r, 1e-300))) * (m0[:, None] - m_star))
        return np.where(flat, m0[:, None] + tt * q, m_star + rest)


def _stage_lrs(stages: BatchStages, lrs) -> list[float]:
    lrs = [float(x) for x in np.atleast_1d(lrs)]
    if len(lrs) != len(stages.sizes):
        raise ValueError(f"one lr per stage: {len(stages.sizes)} stages, {len(lrs)} lrs")
    return lrs


def _pieces(h, c, m0, stages: BatchStages, lrs: list[float], steps: int):
    """Yield ``(t (T,), loss (T,))`` over consecutive integer steps ``0..steps``, stage by stage, in chunks."""
    m = np.asarray(m0, dtype=np.float64)
    bounds = [*stages.starts[1:], np.inf]
    for k, (s0, lr, B) in enumerate(zip(stages.starts, lrs, stages.sizes, strict=True)):
        if s0 > steps:
            return
        end = int(min(bounds[k], steps + 1))  # the stage's own integer steps (the next stage starts at bounds[k])
        for a in range(s0, end, CHUNK):
            t = np.arange(a, min(a + CHUNK, end))
            mm = _moments(h, c, m, lr, B, t - s0)
            loss = 0.5 * (h[:, None] * mm).sum(axis=0)
            yield t, np.where(np.isfinite(loss), loss, np.inf)
        if bounds[k] <= steps:  # the next stage starts from this one's moments at its first step
            m = _moments(h, c, m, lr, B, np.array([bounds[k] - s0]))[:, 0]


def expected_loss_staged(
    h: np.ndarray, c: np.ndarray, theta0_sq: np.ndarray, stages: BatchStages, lrs, steps: int
) -> np.ndarray:
    """``E L(t)`` for ``t = 0..steps`` under the stages (``lrs``: one learning rate per stage); ``inf`` if diverged."""
    h, c, m0 = (np.asarray(x, dtype=np.float64) for x in (h, c, theta0_sq))
    return np.concatenate([loss for _t, loss in _pieces(h, c, m0, stages, _stage_lrs(stages, lrs), steps)])


def expected_to_target_staged(
    h: np.ndarray, c: np.ndarray, theta0_sq: np.ndarray, stages: BatchStages, lrs, target: float, max_steps: int
) -> tuple[float, float]:
    """``(steps, examples)`` at the first (interpolated) crossing of ``E L <= target``; ``(inf, inf)`` if not
    within ``max_steps``. Examples are interpolated between the two integer steps, like the steps."""
    h, c, m0 = (np.asarray(x, dtype=np.float64) for x in (h, c, theta0_sq))
    prev: tuple[int, float] | None = None
    for t, loss in _pieces(h, c, m0, stages, _stage_lrs(stages, lrs), max_steps):
        below = np.flatnonzero(loss <= target)
        if len(below):
            i = int(below[0])
            if i == 0 and prev is None:
                return float(t[0]), float(stages.examples(int(t[0])))
            s0, v0 = (int(t[i - 1]), float(loss[i - 1])) if i > 0 else prev
            frac = (v0 - target) / (v0 - float(loss[i]))
            return s0 + frac, stages.examples(s0) + frac * stages.batch(s0)
        prev = (int(t[-1]), float(loss[-1]))
    return float("inf"), float("inf")
