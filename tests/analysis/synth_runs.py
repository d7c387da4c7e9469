"""Synthetic sweeps with a known hyperbola ``S(B) = S_min + E_min/B`` (test helper, not a test module).

Every trial follows ``L(s) = floor + (L0 - floor) / (1 + s/tau)**alpha`` with ``tau = S(B) · penalty(lr)
· noise``: the best learning rate per batch size has penalty 1, others more; noise is multiplicative
(lognormal). The steps to reach a target ``y`` are ``u(y)·tau`` with ``u(y) =
((L0-floor)/(y-floor))**(1/alpha) - 1``, so the true ``B_crit = E_min/S_min`` at every target and
``S_min(y) = u(y)·S_min``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from analysis import metrics as m
from analysis.gns_view import gns_names
from analysis.loaders import Runs, runs_from_tables
from analysis.schema import METRICS_SCHEMA, trials_table

L0, FLOOR, ALPHA = 1.0, 0.1, 1.0


def u_of(target: float) -> float:
    """Progress (in units of tau) at which the synthetic curve reaches ``target``."""
    return ((L0 - FLOOR) / (target - FLOOR)) ** (1 / ALPHA) - 1


def synth_runs(
    rng: np.random.Generator,
    s_min: float = 200.0,
    e_min: float = 200.0 * 256,
    batch_sizes: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    lr_factors: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0),
    seeds: int = 2,
    sigma: float = 0.1,
    n_evals: int = 60,
    diverge_factor: float = 4.0,
    budget_u: float = 9.0,
    bins: int = 0,
    gns: bool = False,
) -> Runs:
    """A sweep: batch sizes × learning-rate factors × seeds; ``lr = diverge_factor·opt`` trials diverge."""
    grid = np.array([(b, f, s) for b in batch_sizes for f in lr_factors for s in range(seeds)], dtype=np.float64)
    b, f, seed = grid.T
    n = len(grid)
    penalty = 1.0 + 0.3 * np.log2(f) ** 2
    tau = (s_min + e_min / b) * penalty * rng.lognormal(0.0, sigma, n)  # (n,)
    budget = budget_u * (s_min + e_min / b)  # (n,) steps: the same budget for every lr at a batch size
    every = np.maximum(1, np.round(budget / n_evals)).astype(np.int64)
    step = every[:, None] * np.arange(n_evals + 1)[None, :]  # (n, E+1), starts at step 0
    loss = FLOOR + (L0 - FLOOR) / (1.0 + step / tau[:, None]) ** ALPHA
    diverged = f >= diverge_factor
    loss[diverged, n_evals // 3 :] = np.nan  # blew up: later evaluations are NaN
    ids = [f"t{i:04d}" for i in range(n)]
    status = np.where(diverged, m.STATUS_DIVERGED, m.STATUS_BUDGET_SPENT).astype(object)
    status[(loss[:, -1] < 0.2) & ~diverged] = m.STATUS_REACHED_TARGET
    trials = trials_table(
        {
            "trial_id": ids,
            "batch_size": b.astype(np.int64),
            "micro_batch_size": b.astype(np.int64),
            "grad_accum": np.ones(n, np.int64),
            "num_workers": np.ones(n, np.int64),
            "lr": 1e-3 * f * np.sqrt(b / 256),
            "seed": seed.astype(np.int64),
            "status": list(status),
        }
    )
    names = [m.EVAL_LOSS] + [m.per_bin(m.EVAL_LOSS_BIN, k) for k in range(bins)]
    cols: dict[str, list] = {k: [] for k in METRICS_SCHEMA.names}
    for j, name in enumerate(names):
        scale = 1.0 + 0.5 * j  # bins: the same shape on another loss scale
        cols["trial_id"].append(np.repeat(ids, n_evals + 1))
        cols["step"].append(step.ravel())
        cols["examples"].append((step * b[:, None].astype(np.int64)).ravel())
        cols["metric"].append(np.full(step.size, name))
        cols["value"].append((loss * scale).ravel())
    if gns:  # |G|^2 falls with the loss, tr(Sigma) stays: B_simple = tr/|G|^2 grows over training
        for k in [None, *range(bins)]:
            g2 = 10.0 * (loss - FLOOR) * (1.0 + 0.5 * (k or 0))
            trace = np.full_like(g2, 100.0)
            bb = np.broadcast_to(b[:, None], g2.shape)
            noise = rng.normal(0.0, 0.05, (2, *g2.shape))
            vals = [g2 + trace / (bb / 4) * (1 + noise[0]), g2 + trace / bb * (1 + noise[1]), bb / 4, bb]
            for name, val in zip(gns_names(k), vals, strict=True):
                cols["trial_id"].append(np.repeat(ids, n_evals + 1))
                cols["step"].append(step.ravel())
                cols["examples"].append((step * b[:, None].astype(np.int64)).ravel())
                cols["metric"].append(np.full(step.size, name))
                cols["value"].append(np.nan_to_num(val, nan=1e9).ravel())
    metrics = pa.table({k: np.concatenate(v) for k, v in cols.items()}, schema=METRICS_SCHEMA)
    return runs_from_tables(trials, metrics, source="synthetic")
