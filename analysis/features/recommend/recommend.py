"""How to train: the fastest and the cheapest split ``(micro, A, W)`` to reach a target loss (``bcrit recommend``).

For every candidate split, with ``B = micro·A·W``: steps to the target ``S(B) = S_min + E_min/B`` from the sweep's own
fit (:mod:`analysis.fits.pareto`, as ``bcrit analyze``); seconds per step from the sweep's ``sys/`` measurements, or
the fitted throughput model for a split nobody ran (:mod:`analysis.features.recommend.throughput`); **time-to-target**
``S(B) ·
T_step`` (training seconds) and **cost** ``time · W`` in device-hours. Intervals are percentiles of the product of
paired replicates of the steps fit's and the step time's bootstraps. Excluded: a predicted peak memory per worker
above ``gpus_per_worker · device_mem_gb``, or more than one worker with ``gpus_per_worker < 1``
(trainables.config.BaseConfig.check_gpu_share). *Extrapolated*: a batch size outside the fitted ones or, not
measured itself, a micro-batch, accumulation or worker count outside the measured ones.

The Pollux comparison (Qiao et al. OSDI 2021): goodput ``= B/T_step · (φ + M₀)/(φ + B)`` with ``φ`` the gradient
noise scale (``B_simple`` at the target, :mod:`analysis.fits.gns_view`) is this time model with ``B_crit`` replaced by
``B_simple``; :func:`pollux_times` anchors it to the measured steps (one scale, fitted in log space)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analysis.core import metrics as m
from analysis.core.bcrit_error import BcritError
from analysis.core.device_share import share_error
from analysis.features.recommend import throughput
from analysis.fits import gns_view, pareto
from analysis.fits.steps import aggregate_seeds, best_per_batch, pooled_steps
from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import Runs

HOUR = 3600.0


class RecommendError(BcritError):
    """The sweep cannot support a recommendation at this target; the message names why and the fix."""


@dataclass(frozen=True)
class StepsFit:
    """``S(B) = S_min + E_min/B`` at one target, with bootstrap replicates of ``(S_min, E_min)``."""

    target: float
    batch_sizes: np.ndarray  # fitted batch sizes (finite best steps)
    steps: np.ndarray  # their best steps
    s_min: float
    e_min: float
    rep_s_min: np.ndarray  # (R,)
    rep_e_min: np.ndarray  # (R,)

    def predict(self, b: np.ndarray) -> np.ndarray:
        return self.s_min + self.e_min / np.asarray(b, dtype=np.float64)

    def replicates(self, b: np.ndarray) -> np.ndarray:
        """(R, len(b)) replicates of S(b); rows with a failed replicate fit are nan."""
        return self.rep_s_min[:, None] + self.rep_e_min[:, None] / np.asarray(b, dtype=np.float64)[None, :]


def fit_steps(runs: Runs, metric: str, target: float, n_boot: int = 1000, seed: int = 0) -> StepsFit:
    """The steps fit of ``bcrit analyze`` (analysis.fits.sweep_fit.analyze_metric) at one target, keeping the
    replicates,
    with the splits of one batch size pooled (:func:`analysis.fits.steps.pool_splits`)."""
    pooled = pooled_steps(runs, runs.series(metric), [target])
    steps, last, st = pooled.steps, pooled.last, pooled.st
    rng = np.random.default_rng(seed)
    val, low = aggregate_seeds(steps[0], last, st)
    best = best_per_batch(val, low, st)
    boot = pareto.bootstrap_best(steps, last, st, max(n_boot, 1), rng, pareto.ci_resamples(st, best.setting))[1][0]
    pareto.check_enough(float(target), metric, best.batch_sizes, best.steps, best.censored)
    fit = pareto.fit_pareto(best.batch_sizes, best.steps)
    fitted = np.isfinite(best.steps)
    reps = np.where(fitted[None, :], boot, np.nan)
    tau2 = pareto.lack_of_fit_var(best.batch_sizes[fitted], best.steps[fitted], fit, reps[:, fitted])
    reps = pareto.with_lack_of_fit(reps, tau2, rng)
    s_min, e_min = pareto.fit_pareto_batched(best.batch_sizes, reps, np.log([fit.s_min, fit.e_min]))
    return StepsFit(float(target), best.batch_sizes[fitted], best.steps[fitted], fit.s_min, fit.e_min, s_min, e_min)


def candidate_splits(
    measured: np.ndarray, b_range: tuple[float, float], max_workers: int | None = None, max_accum: int | None = None
) -> np.ndarray:
    """(n, 3) splits to consider: micro over the measured micro-batch sizes and the powers of two between them,
    ``A`` and ``W`` over powers of two up to the largest measured (or ``max_accum`` / ``max_workers``), the
    measured splits always; only ``B = micro·A·W`` within ``b_range``."""
    measured = np.asarray(measured, dtype=np.int64).reshape(-1, 3)
    lo_u, hi_u = measured[:, 0].min(), measured[:, 0].max()
    pow2 = 2 ** np.arange(0, 31)
    micros = np.union1d(measured[:, 0], pow2[(pow2 >= lo_u) & (pow2 <= hi_u)])
    a_max = int(max_accum or measured[:, 1].max())
    w_max = int(max_workers or measured[:, 2].max())
    accums = np.union1d(measured[:, 1], pow2[pow2 <= a_max])
    workers = np.union1d(measured[:, 2], pow2[pow2 <= w_max])
    grid = np.array(np.meshgrid(micros, accums, workers, indexing="ij")).reshape(3, -1).T
    grid = np.unique(np.concatenate([grid, measured]), axis=0)
    b = grid.prod(axis=1)
    return grid[(b >= b_range[0]) & (b <= b_range[1])]


def pareto_front(time: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats in both time and cost (ties kept once), by ascending time."""
    order = np.lexsort((cost, time))
    front, best_cost = [], np.inf
    for i in order:
        if cost[i] < best_cost:
            front.append(int(i))
            best_cost = cost[i]
    return np.array(front, dtype=np.int64)


@dataclass
class Plan:
    """Every candidate split with its predictions; ``fastest``/``cheapest``/``front`` index ``splits``."""

    target: float
    metric: str
    unit: str  # "GPU-hours" / "CPU-worker-hours" / "device-hours"
    level: float
    splits: np.ndarray  # (n, 3) micro, A, W
    steps: np.ndarray  # (n,)
    step_s: np.ndarray  # (n,)
    time_s: np.ndarray  # (n,)
    cost_h: np.ndarray  # (n,)
    steps_ci: np.ndarray  # (n, 2)
    step_ci: np.ndarray  # (n, 2)
    time_ci: np.ndarray  # (n, 2)
    cost_ci: np.ndarray  # (n, 2)
    mem_gb: np.ndarray  # (n,) predicted peak memory, nan if unknown
    measured: np.ndarray  # (n,) bool: this split was run
    extrapolated: list[str]  # per candidate: why it is extrapolated ("" if not)
    excluded: list[str]  # per candidate: why it is excluded ("" if eligible)
    fastest: int = -1
    cheapest: int = -1
    device_mem_gb: float | None = None  # the device memory checked against (None: memory not checked)
    gpus_per_worker: float = 1.0  # the share of that device one worker may hold
    front: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    notes: list[str] = field(default_factory=list)

    @property
    def batch_size(self) -> np.ndarray:
        return self.splits.prod(axis=1)

    @property
    def eligible(self) -> np.ndarray:
        return np.array([not e for e in self.excluded], dtype=bool)


def _extrapolation(split: np.ndarray, measured: np.ndarray, fit: StepsFit, is_measured: bool) -> str:
    micro, accum, workers = (int(x) for x in split)
    why = []
    b = micro * accum * workers
    if not fit.batch_sizes.min() <= b <= fit.batch_sizes.max():
        why.append(f"B={b} outside the fitted batch sizes {int(fit.batch_sizes.min())}-{int(fit.batch_sizes.max())}")
    if not is_measured:
        if not measured[:, 0].min() <= micro <= measured[:, 0].max():
            why.append(f"micro {micro} outside the measured {measured[:, 0].min()}-{measured[:, 0].max()}")
        if accum > measured[:, 1].max():
            why.append(f"accumulation {accum} above the measured {measured[:, 1].max()}")
        if workers > measured[:, 2].max():
            why.append(f"{workers} workers, above the measured {measured[:, 2].max()}")
    return "; ".join(why)


def check_gpus_per_worker(gpus_per_worker: float) -> None:
    """``gpus_per_worker`` is a share of one device: a number in (0, 1]."""
    if why := share_error("gpus_per_worker", gpus_per_worker):
        raise RecommendError(why)


def memory_reason(mem_gb: float, device_mem_gb: float, gpus_per_worker: float = 1.0) -> str:
    """Why a split whose predicted peak memory per worker is ``mem_gb`` does not fit (its worker's share of the
    device), or "" when it fits or its memory is unknown."""
    cap = gpus_per_worker * device_mem_gb
    if not (np.isfinite(mem_gb) and mem_gb > cap):
        return ""
    if gpus_per_worker == 1:
        return f"predicted peak memory {mem_gb:.3g} GiB > device {device_mem_gb:g} GiB"
    share = f"{gpus_per_worker:g} of a {device_mem_gb:g} GiB device ({cap:.3g} GiB)"
    return f"predicted peak memory {mem_gb:.3g} GiB > {share}"


def _memory_note(device_mem_gb: float | None, gpus_per_worker: float) -> str:
    """What the memory check was (made only when a share below 1 is worth naming), or why none was made."""
    if device_mem_gb is None:
        share = f" (in gpus_per_worker {gpus_per_worker:g} of it)" if gpus_per_worker < 1 else ""
        return f"memory not checked: pass --device-mem-gb to exclude splits that would not fit{share}"
    return (
        f"memory checked: predicted peak memory per worker against gpus_per_worker {gpus_per_worker:g} of a "
        f"{device_mem_gb:g} GiB device ({gpus_per_worker * device_mem_gb:.3g} GiB)"
    )


def _ci(reps: np.ndarray, level: float) -> np.ndarray:
    """(n, 2) percentile interval of each column of ``reps`` (R, n) over its finite rows."""
    return np.array([pareto.percentile_ci(reps[:, j], level) for j in range(reps.shape[1])]).reshape(-1, 2)


def plan(
    fit: StepsFit,
    times: throughput.SplitTimes,
    splits: np.ndarray,
    metric: str = m.EVAL_LOSS,
    unit: str = "device-hours",
    device_mem_gb: float | None = None,
    level: float = 0.9,
    seed: int = 0,
    *,
    gpus_per_worker: float = 1.0,
) -> Plan:
    """Predict time-to-target and cost of every split in ``splits`` and pick the fastest, cheapest and front.
    ``gpus_per_worker``: the share of one device a worker holds (``scientific.gpus_per_worker``); with
    ``device_mem_gb``, a split is excluded when its predicted peak memory per worker exceeds that share of it."""
    check_gpus_per_worker(gpus_per_worker)
    splits = np.asarray(splits, dtype=np.int64).reshape(-1, 3)
    model = throughput.fit_step_time(times.splits, times.step_s)
    index = {tuple(s): i for i, s in enumerate(times.splits.tolist())}
    is_meas = np.array([tuple(s) in index for s in splits.tolist()], dtype=bool)
    b = splits.prod(axis=1).astype(np.float64)
    estimable = model.estimable(splits)
    step_s = np.where(is_meas, np.nan, model.predict(splits))
    step_s[is_meas] = [times.step_s[index[tuple(s)]] for s in splits[is_meas].tolist()]
    n_boot = len(fit.rep_s_min)
    rng = np.random.default_rng(seed)
    t_reps = throughput.step_time_replicates(times, model, splits, n_boot, rng)  # (R, n)
    s_reps = fit.replicates(b)  # (R, n), paired draws by index
    steps = fit.predict(b)
    time_s = steps * step_s
    cost_h = time_s * splits[:, 2] / HOUR
    mem_model = throughput.fit_memory(times)
    mem = np.full(len(splits), np.nan) if mem_model is None else mem_model.predict(splits[:, 0])
    mem[is_meas] = [times.peak_gb[index[tuple(s)]] for s in splits[is_meas].tolist()]
    excluded = []
    for i in range(len(splits)):
        why = ""
        if not is_meas[i] and not estimable[i]:
            why = (
                "step time not predictable: no measured split varies what this one changes (accumulation, "
                "workers or micro-batch); add such a split to the sweep"
            )
        elif not (np.isfinite(step_s[i]) and step_s[i] > 0):
            why = f"predicted step time {step_s[i]:.3g} s is not positive: the throughput model does not hold here"
        elif gpus_per_worker < 1 and splits[i, 2] > 1:
            why = (
                f"{int(splits[i, 2])} workers at gpus_per_worker {gpus_per_worker:g}: a packed trial runs one worker "
                "(two ranks of one DDP trial on a GPU is what NCCL refuses)"
            )
        elif device_mem_gb is not None:
            why = memory_reason(mem[i], device_mem_gb, gpus_per_worker)
        excluded.append(why)
    with np.errstate(invalid="ignore"):
        time_reps = s_reps * t_reps
    out = Plan(
        target=fit.target, metric=metric, unit=unit, level=level, splits=splits, steps=steps, step_s=step_s,
        time_s=time_s, cost_h=cost_h, steps_ci=_ci(s_reps, level), step_ci=_ci(t_reps, level),
        time_ci=_ci(time_reps, level), cost_ci=_ci(time_reps * splits[None, :, 2] / HOUR, level), mem_gb=mem,
        measured=is_meas, extrapolated=[_extrapolation(s, times.splits, fit, bool(k)) for s, k in zip(splits, is_meas,
                                                                                                      strict=True)],
        excluded=excluded, device_mem_gb=device_mem_gb, gpus_per_worker=float(gpus_per_worker),
    )  # fmt: skip
    if device_mem_gb is None or gpus_per_worker < 1:
        out.notes.append(_memory_note(device_mem_gb, gpus_per_worker))
    if not estimable.all():
        out.notes.append(f"{int((~estimable).sum())} candidate split(s) not predictable from the measured splits")
    choose(out)
    return out


def choose(p: Plan) -> None:
    """Set ``fastest`` (least time; cost breaks ties), ``cheapest`` (least cost; time breaks ties) and ``front``
    among the eligible candidates."""
    ok = np.flatnonzero(p.eligible)
    if len(ok) == 0:
        raise RecommendError("every candidate split is excluded: " + "; ".join(sorted(set(p.excluded))))
    t, c = p.time_s[ok], p.cost_h[ok]
    p.fastest = int(ok[np.lexsort((c, t))[0]])
    p.cheapest = int(ok[np.lexsort((t, c))[0]])
    p.front = ok[pareto_front(t, c)]


def pollux_choice(p: Plan, b_simple: float) -> int:
    """The eligible candidate of largest Pollux goodput ``B/T_step · (φ + M₀)/(φ + B)``, ``φ = b_simple``, ``M₀`` the
    smallest candidate batch size."""
    b = p.batch_size.astype(np.float64)
    m0 = float(b.min())
    goodput = b / p.step_s * (b_simple + m0) / (b_simple + b)
    goodput = np.where(p.eligible, goodput, -np.inf)
    return int(np.argmax(goodput))


def pollux_times(fit: StepsFit, b_simple: float, batch: np.ndarray, step_s: np.ndarray) -> np.ndarray:
    """Pollux's time-to-target ``c·(1 + φ/B)·T_step`` with ``c`` fitted to the measured best steps in log space."""
    c = np.exp(np.mean(np.log(fit.steps) - np.log1p(b_simple / fit.batch_sizes)))
    return c * (1.0 + b_simple / np.asarray(batch, dtype=np.float64)) * np.asarray(step_s)


def recommend(
    runs: Runs,
    target: float,
    metric: str = m.EVAL_LOSS,
    *,
    unit: str = "device-hours",
    device_mem_gb: float | None = None,
    gpus_per_worker: float = 1.0,
    max_workers: int | None = None,
    max_accum: int | None = None,
    max_batch: int | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.9,
) -> tuple[Plan, StepsFit, throughput.SplitTimes]:
    """The whole recommendation in one call (what ``bcrit recommend`` and a batch-size schedule build on): the steps
    fit at ``target``, the measured splits, and the plan over the candidate splits with ``B`` from the smallest
    fitted batch size to ``max_batch`` (default the largest fitted). ``gpus_per_worker``: as in :func:`plan`."""
    check_gpus_per_worker(gpus_per_worker)
    times = throughput.measured_splits(runs)
    fit = fit_steps(runs, metric, target, n_boot, seed)
    hi = max_batch or int(fit.batch_sizes.max())
    splits = candidate_splits(times.splits, (int(fit.batch_sizes.min()), hi), max_workers, max_accum)
    if len(splits) == 0:
        raise RecommendError(f"no candidate split has a batch size in [{int(fit.batch_sizes.min())}, {hi}]")
    p = plan(fit, times, splits, metric, unit, device_mem_gb, level, seed, gpus_per_worker=gpus_per_worker)
    return p, fit, times


def b_simple_at_target(runs: Runs, metric: str, target: float) -> float | None:
    """``B_simple`` at the target, pooled over the fitted trials' windows at their crossings (analysis.fits.gns_view);
    None if not logged."""
    entry = analyze_metric(runs, metric, [target], bootstrap=0)
    gns_view.attach_b_simple(runs, entry)
    return entry[0].get("b_simple")
