"""The noisy quadratic model as a trial: the DiT trial's skeleton (trainables.skeleton: report format, checkpoints,
stop rules) around a `QuadraticLearner`, so a sweep with ``workload: quadratic`` runs through the same machinery in
seconds. Its closed-form B_crit (``closed_form_b_crit``, tests/oracles/nqm.py) is the tests' end-to-end check.

SGD on ``L = ½ Σ h_i θ_i²`` with ``h_i = i^-h_decay``, gradient noise ``N(0, c/B)``, ``c = noise_scale · h``
(the NQM's ``C ∝ H``), ``θ_i(0) = theta0``: the update of ``simulate`` in tests/oracles/nqm.py, one step at a time.
The split ``(micro, A, W)`` changes nothing statistically (the mean of B iid per-example noises); every rank
computes the same update from the same seeded generator, so multi-worker trials stay consistent.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import ClassVar

import numpy as np
from pydantic import model_validator

from analysis.core import metrics as M
from analysis.core.nqm_noise import bin_noise, noise_allocation, weighted_noise
from trainables.branch_points import start_quadratic
from trainables.config import COUNT, LR_RULE, POS, POSITIVE, TEXT, BaseConfig, ConfigError, Float, Int, config_class
from trainables.skeleton import ExamplesRate, Learner, Session, StepOutcome, TrialSkeleton

STATE_FILE = "quadratic_state.json"


@config_class
class QuadraticConfig(BaseConfig):
    """The NQM trial: the shared fields of `trainables.config.BaseConfig` (five with their own defaults here) and
    the problem's own."""

    # --- the problem -------------------------------------------------------------------------------------------
    dim: Int(1, 10**7) = 100  # coordinates; more = expected loss closer to any single run
    h_decay: Float(0) = 1.0  # Hessian spectrum h_i = i^-h_decay, i = 1..dim (Zhang et al. 2019)
    noise_scale: Float(0) = 1.0  # per-example gradient noise covariance c = noise_scale * h
    theta0: Float() = 1.0  # every coordinate starts here
    # --- shared fields with the NQM's defaults ------------------------------------------------------------------
    schedule_lr_rule: LR_RULE = "linear"  # a later stage's lr = lr x B / batch_size (SGD); sqrt | constant
    lr: POSITIVE = 0.1  # plain SGD; stable for lr < 2 / h_max = 2
    max_steps: POS = 1000
    eval_every: POS = 1
    # --- its own -----------------------------------------------------------------------------------------------
    step_seconds: Float(0, 60) = 0.0  # artificial delay per step (tests use it to kill a worker mid-trial)
    # examples per independent noise draw; 0 = one draw of N(0, c/B) per step. With u > 0 a step draws B/u unit
    # noises N(0, c/u) and averages them, so a batch of k·u sees the same unit noises, in the same order, as k
    # steps at u (common random numbers across batch sizes, like a data stream; the branched study sets u = B0)
    noise_unit: COUNT = 0
    # --- timestep bins of different noise (closed forms: tests/oracles/nqm_alloc.py; docs/allocation.md) ----------
    timestep_bins: Int(1, 1000) = 1  # K equal bins; an example of bin k has noise covariance s_k c, s of mean 1
    bin_noise_ratio: POSITIVE = 1.0  # s_{K-1} / s_0 (geometric in k); 1 = every bin the plain NQM's noise
    timestep_sampling: TEXT = "uniform"  # uniform (today's draws) | noise (p_k ∝ sqrt(s_k), weights q_k / p_k)
    alloc_floor: Float(0, 1, lo_open=True) = 0.1  # uniform share mixed into the noise allocation

    WHAT: ClassVar[str] = "quadratic config"

    @model_validator(mode="after")
    def check_noise_unit(self) -> QuadraticConfig:
        for b in self.stages.sizes:
            if self.noise_unit and b % self.noise_unit:
                raise ConfigError(f"noise_unit {self.noise_unit} must divide every batch size, got {b}")
        return self

    @model_validator(mode="after")
    def check_sampling(self) -> QuadraticConfig:
        if self.timestep_sampling not in ("uniform", "noise"):
            raise ConfigError(
                f"the quadratic workload's timestep_sampling is uniform or noise, got {self.timestep_sampling!r} "
                "(its bins share one loss, so a loss-based sampler has nothing to act on)"
            )
        if self.timestep_sampling == "noise" and (self.timestep_bins < 2 or self.noise_unit):
            raise ConfigError("timestep_sampling: noise needs timestep_bins >= 2 and noise_unit: 0")
        return self

    def problem(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(h, c, theta0)`` arrays of the NQM, as tests/oracles/nqm.py takes them."""
        h = np.arange(1, self.dim + 1, dtype=np.float64) ** -self.h_decay
        return h, self.noise_scale * h, np.full(self.dim, self.theta0)


def check_quadratic(cfg: QuadraticConfig, resources: dict | None = None) -> None:
    """Resources only (the problem needs no data)."""
    resources = resources or {"CPU": os.cpu_count() or 1}
    need = max(1, cfg.num_workers) * cfg.cpus_per_worker
    if cfg.use_gpu:
        raise ConfigError("the quadratic workload runs on CPU; set use_gpu: false")
    if need > resources.get("CPU", 0):
        raise ConfigError(f"{need} CPUs asked for but {int(resources.get('CPU', 0))} available; lower num_workers")


class QuadraticLearner(Learner):
    """SGD on the NQM: parameters ``theta`` and the noise generator are its whole state (one JSON file)."""

    def __init__(self, cfg: QuadraticConfig):
        self.cfg = cfg
        self.h, c, self.theta = cfg.problem()
        self.c = c
        self.rng = np.random.default_rng(cfg.seed)
        self._stages: dict[int, tuple[np.ndarray, int, float]] = {}  # stage -> (noise sd, unit draws, lr)
        self.alloc = None  # (s, q, p) of the noise sampler; uniform keeps the plain draws
        self._rate = ExamplesRate(cfg.stages, 0, 0.0)  # sys/examples_per_s per report (restarted by `start`)
        if cfg.timestep_sampling == "noise":
            s, q = bin_noise(cfg.timestep_bins, cfg.bin_noise_ratio), np.full(cfg.timestep_bins, 1 / cfg.timestep_bins)
            self.alloc = (s, q, noise_allocation(s, q, cfg.alloc_floor))

    def stage(self, step: int) -> tuple[np.ndarray, int, float]:
        """``(noise sd, unit noises per step, lr)`` of the step taken with ``step`` steps done (its stage's B)."""
        cfg, stages = self.cfg, self.cfg.stages
        k = stages.index(step)
        if k not in self._stages:
            b = stages.sizes[k]
            lr = stages.lr(step, cfg.lr, cfg.schedule_lr_rule)
            self._stages[k] = (
                np.sqrt(self.c / (cfg.noise_unit or b)),
                b // cfg.noise_unit if cfg.noise_unit else 0,
                lr,
            )
        return self._stages[k]

    def step(self, step: int) -> StepOutcome:
        cfg, h, theta, rng = self.cfg, self.h, self.theta, self.rng
        sd, units, lr = self.stage(step)
        t0 = time.perf_counter()
        with np.errstate(over="ignore", invalid="ignore"):
            if self.alloc is not None:  # importance-weighted bins (the closed form's draw: tests/oracles/nqm_alloc.py)
                B = cfg.stages.batch(step)
                self.theta = theta - lr * weighted_noise(rng, theta, h, self.c, B, *self.alloc)
            else:
                xi = sd * (rng.standard_normal((units, cfg.dim)).mean(0) if units else rng.standard_normal(cfg.dim))
                self.theta = theta - lr * (h * theta + xi)
        if cfg.step_seconds:
            time.sleep(cfg.step_seconds)
        values = {}
        if self.alloc is not None and step == 0:  # the allocation in use (fixed: the known per-bin noise)
            values = {M.per_bin(M.ALLOC_BIN_P, k): float(pk) for k, pk in enumerate(self.alloc[2])}
        return StepOutcome(time.perf_counter() - t0, values)

    def start(self, step: int, train_seconds: float) -> None:
        self._rate = ExamplesRate(self.cfg.stages, step, train_seconds)

    def interval(self, step: int, train_seconds: float) -> dict[str, float]:
        """``sys/examples_per_s`` of the steps since the last report (the wall clock around each step,
        ``step_seconds`` included), so that ``bcrit recommend`` has a measured step time on a quadratic sweep too.
        No ``sys/peak_mem_gb``: the model is a few vectors."""
        rate = self._rate.interval(step, train_seconds)
        return {} if rate is None else {M.SYS_EXAMPLES_PER_S: rate}

    def evaluate(self) -> dict[str, float]:
        with np.errstate(over="ignore", invalid="ignore"):
            loss = float(0.5 * (self.h * self.theta**2).sum())
        return {M.EVAL_LOSS: loss if math.isfinite(loss) else math.inf}

    def state_dict(self) -> dict:
        return {"theta": self.theta.tolist(), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.theta = np.asarray(state["theta"])
        self.rng.bit_generator.state = state["rng"]

    def save(self, directory: str, state) -> None:
        with open(os.path.join(directory, STATE_FILE), "w") as f:
            json.dump(state(), f, default=lambda a: a.tolist())  # the row log's numpy columns as lists

    def load(self, directory: str) -> dict:
        with open(os.path.join(directory, STATE_FILE)) as f:
            return json.load(f)

    def branch_from(self, init_from: str) -> None:
        """The reference's theta, its own noise stream keyed by (seed, branch step)."""
        self.theta, branch_step = start_quadratic(init_from, STATE_FILE)
        self.rng = np.random.default_rng([self.cfg.seed, branch_step])


def train_loop(cfg: QuadraticConfig, session: Session) -> dict:
    """Train until a stop rule fires, reporting like the DiT trial (trainables.skeleton)."""
    started = time.perf_counter()
    trial = TrialSkeleton(cfg, session, QuadraticLearner(cfg), started)
    trial.restore()
    status = trial.run()
    return {"status": status, M.STEP: trial.step, "last": dict(trial.last), "pid": os.getpid()}
