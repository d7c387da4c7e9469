"""A second synthetic-sweep simulator (test and benchmark helper), written independently of ``synth_runs.py``.

Where ``synth_runs`` scales one closed-form curve per trial, this one builds every trial's loss curve by inverting
its own *time-to-progress* function, so that the noise lives where it does in real runs:

1. **Truth.** For a metric with parameters ``(s0, e0, q, L0, floor, alpha)`` the loss ``y`` corresponds to progress
   ``u(y) = ((L0 - floor)/(y - floor))**(1/alpha) - 1``; at the optimal learning rate, with no noise, the steps to
   reach it at batch size ``B`` are ``S(B; y) = S_min(y) + E_min(y)/B`` with ``S_min = s0·u`` and ``E_min =
   e0·u**q``. So ``B_crit(y) = (e0/s0)·u(y)**(q-1)`` is known exactly at every target (it grows along training when
   ``q > 1``), for ``eval/loss`` and for every timestep bin ``eval/loss/bin{k}`` (each with its own parameters).
2. **A trial** (batch size, lr, seed) needs ``T(u) = S(B; u)·(1 + kappa·d²)·exp(eps(u))`` steps to reach progress
   ``u``: ``d = log2(lr / lr_opt)`` with the optimum ``lr_opt`` moving with ``B`` (``lr_slope`` octaves per octave of
   ``B``, from a point drawn per sweep) and jittered per trial (``lr_jitter`` octaves: the optimum varies from seed
   to seed); ``eps`` is a stationary Gauss-Markov process in ``log u`` (sd ``sigma``, correlation length
   ``corr_len``): the multiplicative per-seed noise is correlated along the trial's loss curve, so one trial is early
   or late at neighbouring targets alike. A bin's ``eps`` shares ``bin_share`` of its variance with the global one.
3. **Evaluations** every ``eval_every(B)`` steps (about ``n_evals`` per trial up to the stop): the loss is the curve's
   value there plus Gaussian evaluation noise (``eval_noise`` x the loss above the floor); the analysis interpolates
   crossings between evaluations, as on real runs.
4. **Stopping**: a trial stops at the first evaluation where ``eval/loss <= stop_loss`` (a global target: lower
   targets are censored, and bins stop with it) or at its step budget; at ``B >= diverge_from`` the largest lr
   diverges (NaN from a third of its run on).

The grid has ``n_lr`` learning rates ``lr_ref·2**(k·lr_step)`` (k centred on 0; five an octave apart by default);
``rate_jitter`` adds a per-trial constant log-rate factor (normal or heavy-tailed), ``stop_at_target=False`` runs every
trial to its budget.
``SHAPES`` (in ``synth_shapes.py``) are the variants the interval's coverage is checked on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from analysis.core import metrics as m
from analysis.sources.loaders import Runs, runs_from_tables
from analysis.sources.schema import METRICS_SCHEMA, trials_table


@dataclass(frozen=True)
class Curve:
    """One metric's truth: ``S(B; y) = s0·u(y) + e0·u(y)**q / B``."""

    s0: float = 40.0  # steps per unit progress at infinite batch size
    e0: float = 40.0 * 256  # examples per unit progress at batch size -> 0 (B_crit = 256 at u = 1)
    q: float = 1.15  # E_min grows faster than S_min: B_crit rises along training
    l0: float = 2.0  # loss at step 0
    floor: float = 0.5  # irreducible loss
    alpha: float = 0.8  # loss = floor + (l0 - floor)·(1 + u)**(-alpha)

    def progress(self, y):
        return ((self.l0 - self.floor) / (np.asarray(y, dtype=np.float64) - self.floor)) ** (1 / self.alpha) - 1

    def loss(self, u):
        return self.floor + (self.l0 - self.floor) * (1 + u) ** (-self.alpha)

    def b_crit(self, y) -> np.ndarray:
        """The exact critical batch size at target loss ``y``."""
        return (self.e0 / self.s0) * self.progress(y) ** (self.q - 1)


# four timestep bins with different B_crit (about 64, 160, 420, 1100 at u = 1) and loss scales
BIN_CURVES = (
    Curve(s0=60.0, e0=60.0 * 64, q=1.05, l0=0.9, floor=0.05, alpha=1.0),
    Curve(s0=45.0, e0=45.0 * 160, q=1.1, l0=1.6, floor=0.3, alpha=0.9),
    Curve(s0=35.0, e0=35.0 * 420, q=1.2, l0=2.4, floor=0.7, alpha=0.8),
    Curve(s0=30.0, e0=30.0 * 1100, q=1.25, l0=3.0, floor=1.2, alpha=0.7),
)


@dataclass(frozen=True)
class Sweep:
    """A sweep shaped like a real one; every field changes the data."""

    batch_sizes: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048)
    seeds: int = 3
    lr_ref: float = 1e-3  # the grid's middle lr
    lr_opt_256: float = 0.0  # octaves of the optimum above lr_ref at B = 256 ...
    lr_opt_spread: float = 0.5  # ... plus a uniform draw in ±this, once per sweep (where the grid falls varies)
    lr_slope: float = 0.3  # octaves the optimum moves per octave of B
    lr_jitter: float = 0.15  # sd (octaves) of the optimum from trial to trial
    kappa: float = 0.3  # steps penalty per squared octave off the optimum (+30% one octave off)
    sigma: float = 0.04  # sd of log steps between seeds
    corr_len: float = 1.5  # correlation length of the noise along the curve, in log progress
    bin_share: float = 0.5  # share of a bin's noise variance common with the global curve
    eval_noise: float = 0.004  # evaluation noise, relative to the loss above the floor
    n_evals: int = 60  # evaluations per trial up to the stop (at the optimal lr)
    eval_every: int = 0  # > 0: every trial evaluates every this many steps, whatever its batch size (not n_evals)
    noise_of: str = "above_floor"  # eval_noise relative to the loss above the floor, or to the whole "loss"
    stop_progress: float = 6.0  # the global target: eval/loss at this progress (censors lower targets)
    budget: float = 2.0  # step budget, in units of the optimal-lr steps to the stop
    diverge_from: int = 512  # the largest lr diverges at batch sizes from here on
    n_lr: int = 5  # learning rates in the grid: lr_ref·2**(k·lr_step), k centred on 0 (3, 5, 7, ...)
    lr_step: float = 1.0  # octaves between neighbouring grid learning rates
    rate_jitter: float = 0.0  # sd of a per-trial constant log-rate factor (on top of the correlated ``sigma``)
    jitter_tail: str = "normal"  # its distribution: "normal", or "t3" (Student t, 3 dof, scaled to sd rate_jitter)
    stop_at_target: bool = True  # False: every trial runs its whole step budget (no global target)
    curve: Curve = field(default_factory=Curve)
    bins: tuple[Curve, ...] = BIN_CURVES

    @property
    def stop_loss(self) -> float:
        return float(self.curve.loss(self.stop_progress))


def _noise_paths(rng: np.random.Generator, n: int, logu: np.ndarray, sd: float, corr_len: float) -> np.ndarray:
    """(n, len(logu)) stationary Gauss-Markov paths over ``logu`` (sd ``sd``, correlation ``exp(-Δ/corr_len)``)."""
    out = np.empty((n, len(logu)))
    out[:, 0] = rng.normal(0.0, sd, n)
    for j in range(1, len(logu)):
        r = np.exp(-(logu[j] - logu[j - 1]) / corr_len)
        out[:, j] = r * out[:, j - 1] + np.sqrt(1 - r * r) * rng.normal(0.0, sd, n)
    return out


def _losses(curve: Curve, b, pen, eps, logu, step) -> np.ndarray:
    """Loss of every trial at its evaluation steps: invert ``T(u) = S(B; u)·pen·exp(eps(u))`` on the ``u`` grid."""
    u = np.exp(logu)[None, :]
    t = (curve.s0 * u + curve.e0 * u**curve.q / b[:, None]) * pen[:, None] * np.exp(eps)  # (n, U)
    t = np.maximum.accumulate(t, axis=1)  # time to progress is non-decreasing
    shift = (t.max() + 1.0) * np.arange(len(b))[:, None]  # rows apart: one sorted array, one search
    flat_t = (t + shift).ravel()
    flat_s = (np.minimum(step, t[:, -1:]) + shift).ravel()
    j = np.clip(np.searchsorted(flat_t, flat_s), 1, flat_t.size - 1)
    t0, t1 = flat_t[j - 1], flat_t[j]
    lu = np.tile(logu, len(b))
    frac = np.clip((flat_s - t0) / np.maximum(t1 - t0, 1e-300), 0.0, 1.0)
    u = np.exp(lu[j - 1] + frac * (lu[j] - lu[j - 1])).reshape(step.shape)
    out = np.where(step < t[:, :1], np.exp(logu[0]) * step / t[:, :1], u)  # before the grid: progress from 0
    return curve.loss(out)


def _rate_jitter(rng: np.random.Generator, n: int, sw: Sweep) -> np.ndarray:
    """Per-trial constant log-rate factors with sd ``rate_jitter`` (normal, or t with 3 dof: sd = scale·sqrt(3))."""
    if sw.jitter_tail == "t3":
        return rng.standard_t(3, n) * sw.rate_jitter / np.sqrt(3.0)
    if sw.jitter_tail != "normal":
        raise ValueError(f"jitter_tail must be 'normal' or 't3', got {sw.jitter_tail!r}")
    return rng.normal(0.0, sw.rate_jitter, n)


def simulate(rng: np.random.Generator, sw: Sweep = Sweep()) -> Runs:
    """Draw one sweep: ``batch_sizes x n_lr learning rates x seeds`` trials, ``eval/loss`` and ``eval/loss/bin{k}``."""
    k = np.arange(sw.n_lr) - (sw.n_lr - 1) // 2
    grid = np.array([(b, kk, s) for b in sw.batch_sizes for kk in k for s in range(sw.seeds)], dtype=np.float64)
    b, kk, seed = grid.T
    n = len(grid)
    opt = sw.lr_opt_256 + rng.uniform(-sw.lr_opt_spread, sw.lr_opt_spread) + sw.lr_slope * np.log2(b / 256)
    logu = np.linspace(np.log(1e-3), np.log(sw.stop_progress * 4), 160)
    s_stop = sw.curve.s0 * sw.stop_progress + sw.curve.e0 * sw.stop_progress**sw.curve.q / b
    every = np.maximum(1, np.round(s_stop / sw.n_evals)).astype(np.int64)
    n_steps = int(np.ceil(sw.budget * sw.n_evals)) + 1
    if sw.eval_every > 0:
        every = np.full(n, sw.eval_every, dtype=np.int64)
        n_steps = int(np.ceil(sw.budget * s_stop.max() / sw.eval_every)) + 1
    step = every[:, None] * np.arange(n_steps)[None, :]  # (n, E)
    own_end = np.full(n, n_steps - 1)  # the last evaluation of each trial's step budget
    if sw.eval_every > 0:
        own_end = np.minimum(n_steps - 1, np.ceil(sw.budget * s_stop / every)).astype(np.int64)
    eps0 = _noise_paths(rng, n, logu, sw.sigma, sw.corr_len)
    curves = [sw.curve, *sw.bins]
    losses = []
    d_global = kk * sw.lr_step - opt - rng.normal(0.0, sw.lr_jitter, n)  # octaves off this trial's optimum
    eps0 = eps0 + _rate_jitter(rng, n, sw)[:, None]
    for j, c in enumerate(curves):
        d = d_global if j == 0 else d_global - 0.15 * (j - 2.5)  # a bin's optimum sits a little off the global one
        pen = 1.0 + sw.kappa * d**2
        eps = eps0
        if j:  # a bin's noise: partly the global curve's, partly its own
            own = _noise_paths(rng, n, logu, sw.sigma * np.sqrt(1 - sw.bin_share), sw.corr_len)
            eps = np.sqrt(sw.bin_share) * eps0 + own
        y = _losses(c, b, pen, eps, logu, step)
        scale = y if sw.noise_of == "loss" else y - c.floor
        y = y + rng.normal(0.0, 1.0, y.shape) * sw.eval_noise * scale
        losses.append(y)
    diverged = (kk == k[-1]) & (b >= sw.diverge_from)
    for y in losses:
        y[diverged[:, None] & (np.arange(n_steps)[None, :] >= (own_end[:, None] + 1) // 3)] = np.nan
    hit = (losses[0] <= sw.stop_loss) & sw.stop_at_target & (np.arange(n_steps)[None, :] <= own_end[:, None])
    reached = hit.any(axis=1) & ~diverged
    last = np.where(reached, hit.argmax(axis=1), own_end)
    keep = np.arange(n_steps)[None, :] <= last[:, None]
    status = np.full(n, m.STATUS_BUDGET_SPENT, dtype=object)
    status[reached] = m.STATUS_REACHED_TARGET
    status[diverged] = m.STATUS_DIVERGED
    ids = [f"s{i:04d}" for i in range(n)]
    trials = trials_table(
        {
            "trial_id": ids,
            "batch_size": b.astype(np.int64),
            "micro_batch_size": b.astype(np.int64),
            "grad_accum": np.ones(n, np.int64),
            "num_workers": np.ones(n, np.int64),
            "lr": sw.lr_ref * 2.0 ** (kk * sw.lr_step),
            "seed": seed.astype(np.int64),
            "status": list(status),
        }
    )
    names = [m.EVAL_LOSS] + [m.per_bin(m.EVAL_LOSS_BIN, j) for j in range(len(sw.bins))]
    tid = np.repeat(np.array(ids, dtype=object), n_steps).reshape(step.shape)
    cols = {
        "trial_id": np.concatenate([tid[keep]] * len(names)),
        "step": np.concatenate([step[keep]] * len(names)),
        "examples": np.concatenate([(step * b[:, None].astype(np.int64))[keep]] * len(names)),
        "metric": np.concatenate([np.full(int(keep.sum()), nm) for nm in names]),
        "value": np.concatenate([y[keep] for y in losses]),
    }
    return runs_from_tables(trials, pa.table(cols, schema=METRICS_SCHEMA), source="synthetic (synth_sweeps)")


def truth(sw: Sweep, metric: str, target: float) -> float:
    """The exact B_crit of ``metric`` (``eval/loss`` or ``eval/loss/bin{k}``) at ``target``."""
    if metric == m.EVAL_LOSS:
        return float(sw.curve.b_crit(target))
    k = int(metric.rsplit("bin", 1)[1])
    return float(sw.bins[k].b_crit(target))
