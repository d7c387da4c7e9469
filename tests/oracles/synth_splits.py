"""Synthetic sweeps with several splits per batch size and known step times (test helper for bcrit recommend).

Steps: every trial follows ``L(s) = FLOOR + (L0 - FLOOR)/(1 + s/tau)`` (tests/oracles/synth_runs.py's curve) with
``tau = S(B)·(1 + 0.3·log2(f)²)·exp(sigma·z)`` (``z`` shared by the splits of one batch size, lr and seed),
``S(B) = s_min + e_min/B``, learning-rate factors ``f`` (the best, ``f = 1``, has no penalty): the
true steps to a target ``y`` at the best lr are ``u(y)·S(B)``. Step time: the split's ``T = gamma + A·(alpha +
beta·micro) + kappa·2(W-1)/W`` times ``exp(sigma_t·z)`` per trial and per report (reported
as ``sys/examples_per_s = B/T``); peak memory ``mem0 + mem1·micro``. ``wall_time`` is ``step·T`` of the trial.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from analysis.core import metrics as m
from analysis.sources.loaders import Runs, runs_from_tables
from analysis.sources.schema import METRICS_SCHEMA_WITH_WALL_TIME, trials_table

L0, FLOOR = 1.0, 0.1
TRUE_STEP = dict(gamma=0.01, alpha=0.004, beta=0.0005, kappa=0.006)
SPLITS = (  # (micro, A, W): every batch size two or more ways
    (16, 1, 1), (8, 2, 1), (8, 1, 2),
    (32, 1, 1), (16, 2, 1), (16, 1, 2),
    (64, 1, 1), (32, 2, 1), (32, 1, 2), (16, 4, 1),
    (128, 1, 1), (64, 2, 1), (64, 1, 2),
    (256, 1, 1), (128, 2, 1),
)  # fmt: skip


def u_of(target: float) -> float:
    return (L0 - FLOOR) / (target - FLOOR) - 1.0


def true_step_time(splits, gamma=None, alpha=None, beta=None, kappa=None) -> np.ndarray:
    c = {**TRUE_STEP, **{k: v for k, v in dict(gamma=gamma, alpha=alpha, beta=beta, kappa=kappa).items() if v}}
    s = np.asarray(splits, dtype=np.float64).reshape(-1, 3)
    micro, a, w = s.T
    return c["gamma"] + a * (c["alpha"] + c["beta"] * micro) + c["kappa"] * 2 * (w - 1) / w


def synth_split_runs(
    rng: np.random.Generator,
    s_min: float = 40.0,
    e_min: float = 40.0 * 48,
    splits=SPLITS,
    lr_factors=(0.5, 1.0, 2.0),
    seeds: int = 2,
    sigma: float = 0.05,
    sigma_t: float = 0.05,
    n_evals: int = 80,
    reports: int = 4,
    mem0: float = 1.0,
    mem1: float = 0.01,
    sys_metrics: bool = True,
) -> Runs:
    grid = [(sp, f, sd) for sp in splits for f in lr_factors for sd in range(seeds)]
    n = len(grid)
    sp = np.array([g[0] for g in grid], dtype=np.int64)
    f = np.array([g[1] for g in grid])
    b = sp.prod(axis=1)
    # the seed's noise is shared by the splits of one (B, lr, seed): with the same seed and data order, splits of
    # one batch size take the same steps up to numerics (the demo's three splits of B = 64 reach 0.21 at the same
    # step); independent noise per split would make the best-of-splits minimum biased low
    key = np.unique(np.stack([b, f, [g[2] for g in grid]], axis=1), axis=0, return_inverse=True)[1].ravel()
    z = rng.standard_normal(key.max() + 1)[key]
    tau = (s_min + e_min / b) * (1 + 0.3 * np.log2(f) ** 2) * np.exp(sigma * z)
    last = 12.0 * (s_min + e_min / b)  # steps budget: far beyond every target used
    step = np.round(last[:, None] * np.arange(n_evals + 1)[None, :] / n_evals).astype(np.int64)
    loss = FLOOR + (L0 - FLOOR) / (1 + step / tau[:, None])
    t_trial = true_step_time(sp) * np.exp(sigma_t * rng.standard_normal(n))
    ids = [f"s{i:04d}" for i in range(n)]
    trials = trials_table(
        {
            "trial_id": ids, "batch_size": b, "micro_batch_size": sp[:, 0], "grad_accum": sp[:, 1],
            "num_workers": sp[:, 2], "lr": 1e-3 * f * np.sqrt(b / 16), "seed": np.array([g[2] for g in grid]),
            "status": [m.STATUS_BUDGET_SPENT] * n,
        }
    )  # fmt: skip
    cols: dict[str, list] = {k: [] for k in METRICS_SCHEMA_WITH_WALL_TIME.names}

    def add(i: int, steps: np.ndarray, name: str, vals: np.ndarray) -> None:
        cols["trial_id"].append(np.full(len(steps), ids[i]))
        cols["step"].append(steps)
        cols["examples"].append(steps * b[i])
        cols["metric"].append(np.full(len(steps), name))
        cols["value"].append(np.asarray(vals, dtype=np.float64))
        cols["wall_time"].append(steps * t_trial[i])

    for i in range(n):
        add(i, step[i], m.EVAL_LOSS, loss[i])
        if sys_metrics:
            rs = step[i][np.linspace(n_evals // reports, n_evals, reports).astype(int)]
            t_rep = t_trial[i] * np.exp(sigma_t * rng.standard_normal(reports))
            add(i, rs, m.SYS_EXAMPLES_PER_S, b[i] / t_rep)
            add(i, rs, m.SYS_PEAK_MEM_GB, np.full(reports, mem0 + mem1 * sp[i, 0]))
    metrics = pa.table({k: np.concatenate(v) for k, v in cols.items()}, schema=METRICS_SCHEMA_WITH_WALL_TIME)
    return runs_from_tables(trials, metrics, source="synthetic splits")
