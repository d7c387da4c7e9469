"""Step time and peak memory per split ``(micro, A, W)``, measured and modelled (for ``bcrit recommend``).

**Measured.** A trial's step time is ``B / median(sys/examples_per_s)`` over its reports (the median: the first
interval holds warm-up); a split's is the mean over its trials (throughput does not depend on lr or seed), its scatter
the bootstrap of that mean over trials (over one trial's reports when the split has one).

**Modelled**: ``T_step(micro, A, W) = γ + A·(α + β·micro) + κ·2(W-1)/W`` (a fixed step cost, ``A`` micro-steps, one
ring all-reduce), fitted by non-negative least squares on the relative error. A split is predicted only when it is
*estimable* (:meth:`ThroughputModel.estimable`: its features lie in the span of the measured splits', where every
least-squares solution predicts alike). Peak memory is ``m0 + m1·micro`` over the trials' ``sys/peak_mem_gb``. Why
this model and these choices: docs/design.md."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.core import metrics as m
from analysis.core.bcrit_error import BcritError
from analysis.sources.loaders import Runs

FEATURES = ("gamma", "alpha", "beta", "kappa")  # s per step, per micro-step, per example of a micro-step, per ring


class NoThroughputError(BcritError):
    """The runs hold no usable ``sys/`` measurements; the message names what is missing and the fix."""


@dataclass(frozen=True)
class SplitTimes:
    """Measured step time and peak memory of each split ``(micro, A, W)`` present in a sweep."""

    splits: np.ndarray  # (n, 3) int64: micro, accum, workers, sorted
    step_s: np.ndarray  # (n,) mean step seconds over the split's trials
    units: list[np.ndarray]  # per split, the step seconds its bootstrap resamples (trials, or one trial's reports)
    peak_gb: np.ndarray  # (n,) largest peak memory (GiB) of the split's trials; nan if none reported
    n_trials: np.ndarray  # (n,) int64

    @property
    def batch_size(self) -> np.ndarray:
        return self.splits.prod(axis=1)


def _per_trial(runs: Runs, name: str) -> dict[int, np.ndarray]:
    s = runs.series(name)
    out: dict[int, np.ndarray] = {}
    if len(s.trial) == 0:
        return out
    starts = np.flatnonzero(np.r_[True, s.trial[1:] != s.trial[:-1]])
    for a, b in zip(starts, np.append(starts[1:], len(s.trial)), strict=True):
        v = s.value[a:b]
        v = v[np.isfinite(v) & (v > 0)]
        if len(v):
            out[int(s.trial[a])] = v
    return out


def split_columns(runs: Runs) -> np.ndarray:
    """(n_trials, 3) int64: each trial's ``(micro_batch_size, grad_accum, num_workers)``; workers >= 1."""
    cols = [
        runs.trials.column(c).to_numpy().astype(np.int64) for c in ("micro_batch_size", "grad_accum", "num_workers")
    ]
    out = np.stack(cols, axis=1)
    out[:, 2] = np.maximum(out[:, 2], 1)  # an in-process trial is one worker
    return out


def measured_splits(runs: Runs) -> SplitTimes:
    """Step time and peak memory per split from every trial not failed."""
    rows = np.flatnonzero(runs.status != m.STATUS_FAILED)
    rate = _per_trial(runs, m.SYS_EXAMPLES_PER_S)
    mem = _per_trial(runs, m.SYS_PEAK_MEM_GB)
    have = [int(r) for r in rows if int(r) in rate]
    if not have:
        raise NoThroughputError(
            f"no trial of {runs.source or 'the sweep'} reported {m.SYS_EXAMPLES_PER_S} (a sweep from before the "
            "sys/ metrics, or its trials failed): re-run the sweep with today's bcrit to measure step times"
        )
    sp = split_columns(runs)
    keys = np.unique(sp[have], axis=0)
    step_s, units, peak, count = [], [], [], []
    for key in keys:
        trials = [r for r in have if (sp[r] == key).all()]
        b = float(key.prod())
        per_trial = np.array([b / np.median(rate[r]) for r in trials])
        units.append(per_trial if len(trials) > 1 else b / rate[trials[0]])
        step_s.append(float(per_trial.mean()))
        mems = [float(mem[r].max()) for r in trials if r in mem]
        peak.append(max(mems) if mems else np.nan)
        count.append(len(trials))
    return SplitTimes(keys, np.array(step_s), units, np.array(peak), np.array(count, dtype=np.int64))


def design(splits: np.ndarray) -> np.ndarray:
    """(n, 4) features ``[1, A, A·micro, 2(W-1)/W]`` of splits ``(micro, A, W)``."""
    s = np.asarray(splits, dtype=np.float64).reshape(-1, 3)
    micro, accum, workers = s.T
    return np.stack([np.ones_like(micro), accum, accum * micro, 2.0 * (workers - 1.0) / workers], axis=1)


@dataclass(frozen=True)
class ThroughputModel:
    """``T_step = γ + A·(α + β·micro) + κ·2(W-1)/W`` (module docstring), non-negative coefficients."""

    coef: np.ndarray  # (4,) gamma, alpha, beta, kappa
    rank: int  # of the measured splits' design
    basis: np.ndarray  # (rank, 4) orthonormal basis of the span of the measured splits' features
    rms_log: float  # root-mean-square of log(measured / fitted) over the measured splits
    residual_log: np.ndarray  # (n,) log(measured / fitted) per measured split

    def predict(self, splits: np.ndarray) -> np.ndarray:
        return design(splits) @ self.coef

    def estimable(self, splits: np.ndarray) -> np.ndarray:
        """Whether each split's step time is determined by the measured splits (features in their span)."""
        x = design(splits)
        off = x - (x @ self.basis.T) @ self.basis
        return np.linalg.norm(off, axis=1) <= 1e-9 * np.maximum(np.linalg.norm(x, axis=1), 1.0)

    def sigma_log(self, n: int) -> float:
        """Prediction scatter (log) of a split not measured: the residual rms, dof-corrected (nan if no dof)."""
        return float(self.rms_log * np.sqrt(n / (n - self.rank))) if n > self.rank else float("nan")


def nnls_relative(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``argmin_{c >= 0} Σ ((x·c - t)/t)²`` (scipy's Lawson-Hanson NNLS on the rows scaled by ``1/t``)."""
    from scipy.optimize import nnls

    return nnls(x / t[:, None], np.ones_like(t))[0]


def fit_step_time(splits: np.ndarray, step_s: np.ndarray) -> ThroughputModel:
    """Non-negative least squares on the relative error (module docstring)."""
    x = design(splits)
    t = np.asarray(step_s, dtype=np.float64)
    _, sv, vt = np.linalg.svd(x / t[:, None], full_matrices=False)
    rank = int((sv > sv.max() * 1e-10).sum()) if len(sv) else 0
    coef = nnls_relative(x, t)
    with np.errstate(divide="ignore", invalid="ignore"):
        resid = np.log(t / (x @ coef))
    rms = float(np.sqrt(np.mean(resid**2))) if len(t) else float("nan")
    return ThroughputModel(coef, rank, vt[:rank], rms, resid)


@dataclass(frozen=True)
class MemoryModel:
    """Peak memory ``m0 + m1·micro`` (GiB) over the trials' peaks (one micro-batch size: their maximum)."""

    m0: float
    m1: float

    def predict(self, micro: np.ndarray) -> np.ndarray:
        return self.m0 + self.m1 * np.asarray(micro, dtype=np.float64)


def fit_memory(times: SplitTimes) -> MemoryModel | None:
    ok = np.isfinite(times.peak_gb)
    if not ok.any():
        return None
    micro, peak = times.splits[ok, 0].astype(np.float64), times.peak_gb[ok]
    if len(np.unique(micro)) < 2:
        return MemoryModel(float(peak.max()), 0.0)
    m1, m0 = np.polyfit(micro, peak, 1)
    return MemoryModel(float(m0), float(m1))


def step_time_replicates(
    times: SplitTimes, model: ThroughputModel, targets: np.ndarray, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """(R, n_targets) bootstrap replicates of the step time of the splits ``targets`` ((n_targets, 3)).

    Each replicate resamples every measured split's units (trials, or one trial's reports) and re-takes their
    mean; a measured target takes its own split's resampled mean, any other target the model refitted to the
    resampled means times ``exp(σ·z)``, ``σ`` the model's dof-corrected residual scatter."""
    targets = np.asarray(targets, dtype=np.int64).reshape(-1, 3)
    reps = np.empty((n_boot, len(times.step_s)))
    for i, u in enumerate(times.units):
        reps[:, i] = u[rng.integers(0, len(u), size=(n_boot, len(u)))].mean(axis=1)
    x = design(times.splits)
    coef = np.array([nnls_relative(x, r) for r in reps])  # (R, 4)
    out = coef @ design(targets).T  # (R, n_targets)
    sigma = model.sigma_log(len(times.step_s))
    noise = rng.standard_normal(out.shape)
    out = out * np.exp((sigma if np.isfinite(sigma) else 0.0) * noise)
    index = {tuple(s): i for i, s in enumerate(times.splits.tolist())}
    for j, s in enumerate(targets.tolist()):
        if tuple(s) in index:
            out[:, j] = reps[:, index[tuple(s)]]
    return out
