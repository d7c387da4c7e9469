"""The noisy quadratic model (analysis.quadratic) as a trial: same report format, checkpoints and stop rules as
the DiT trial (trainables.loop), so a sweep with ``workload: quadratic`` runs through the same machinery in
seconds. Its closed-form B_crit (``analysis.quadratic.closed_form_b_crit``) is the end-to-end check.

SGD on ``L = ½ Σ h_i θ_i²`` with ``h_i = i^-h_decay``, gradient noise ``N(0, c/B)``, ``c = noise_scale · h``
(the NQM's ``C ∝ H``), ``θ_i(0) = theta0``: the update of :func:`analysis.quadratic.simulate`, one step at a time.
The split ``(micro, A, W)`` changes nothing statistically (the mean of B iid per-example noises); every rank
computes the same update from the same seeded generator, so multi-worker trials stay consistent.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from analysis import metrics as M
from trainables.config import ConfigError, config_from_dict
from trainables.stopping import eval_status, status_after_step

STATE_FILE = "quadratic_state.json"


@dataclass(frozen=True)
class QuadraticConfig:
    # --- the problem -------------------------------------------------------------------------------------------
    dim: int = 100  # coordinates; more = expected loss closer to any single run
    h_decay: float = 1.0  # Hessian spectrum h_i = i^-h_decay, i = 1..dim (Zhang et al. 2019)
    noise_scale: float = 1.0  # per-example gradient noise covariance c = noise_scale * h
    theta0: float = 1.0  # every coordinate starts here
    # --- the scientific variable and its split (same keys as the DiT trial) ---------------------------------
    batch_size: int = 32
    micro_batch_size: int = 32
    num_workers: int = 0
    grad_accum: int | None = None
    # --- optimisation and stopping -----------------------------------------------------------------------------
    lr: float = 0.1  # plain SGD; stable for lr < 2 / h_max = 2
    seed: int = 0
    max_steps: int = 1000
    target_loss: float | None = None
    divergence_factor: float = 3.0
    eval_every: int = 1
    report_every: int = 0  # 0 = eval_every
    checkpoint_every: int = 0  # 0 = only at the end
    step_seconds: float = 0.0  # artificial delay per step (tests use it to kill a worker mid-trial)
    # --- resources -----------------------------------------------------------------------------------------------
    use_gpu: bool = False
    cpus_per_worker: int = 1
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        per = self.micro_batch_size * max(1, self.num_workers)
        for name in ("dim", "batch_size", "micro_batch_size", "max_steps", "eval_every", "cpus_per_worker"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size % per or (self.grad_accum is not None and self.grad_accum * per != self.batch_size):
            raise ConfigError(
                f"batch_size {self.batch_size} != micro_batch_size {self.micro_batch_size} x grad_accum "
                f"{self.grad_accum} x workers {max(1, self.num_workers)}; fix the split"
            )
        if not self.lr > 0 or self.divergence_factor <= 1 or self.num_workers < 0:
            raise ConfigError("lr must be > 0, divergence_factor > 1 and num_workers >= 0")
        if self.checkpoint_every and self.checkpoint_every % self.report_interval:
            raise ConfigError(f"checkpoint_every must be a multiple of report_every {self.report_interval}")

    @property
    def accum(self) -> int:
        return self.batch_size // (self.micro_batch_size * max(1, self.num_workers))

    @property
    def report_interval(self) -> int:
        return self.report_every or self.eval_every

    def problem(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(h, c, theta0)`` arrays of the NQM, as analysis.quadratic takes them."""
        h = np.arange(1, self.dim + 1, dtype=np.float64) ** -self.h_decay
        return h, self.noise_scale * h, np.full(self.dim, self.theta0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "grad_accum": self.accum}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuadraticConfig:
        return config_from_dict(cls, data, "quadratic config")


def check_quadratic(cfg: QuadraticConfig, resources: dict | None = None) -> None:
    """Resources only (the problem needs no data)."""
    resources = resources or {"CPU": os.cpu_count() or 1}
    need = max(1, cfg.num_workers) * cfg.cpus_per_worker
    if cfg.use_gpu:
        raise ConfigError("the quadratic workload runs on CPU; set use_gpu: false")
    if need > resources.get("CPU", 0):
        raise ConfigError(f"{need} CPUs asked for but {int(resources.get('CPU', 0))} available; lower num_workers")


def train_loop(cfg: QuadraticConfig, session) -> dict:
    """Train until a stop rule fires, reporting like trainables.loop (rows, counters, status, checkpoints)."""
    t_start = time.perf_counter()
    h, c, theta = cfg.problem()
    rng = np.random.default_rng(cfg.seed)
    step, first_eval, train_seconds, status = 0, None, 0.0, M.STATUS_RUNNING
    with session.restore() as d:
        if d:
            with open(os.path.join(d, STATE_FILE)) as f:
                s = json.load(f)
            theta, step, first_eval = np.asarray(s["theta"]), s["step"], s["first_eval"]
            train_seconds, status = s["train_seconds"], s["status"]
            rng.bit_generator.state = s["rng"]
    startup = time.perf_counter() - t_start
    sd = np.sqrt(c / cfg.batch_size)
    rows: list[list] = []
    last: dict[str, float] = {}

    def evaluate() -> str:
        nonlocal first_eval
        with np.errstate(over="ignore", invalid="ignore"):
            loss = float(0.5 * (h * theta**2).sum())
        loss = loss if math.isfinite(loss) else math.inf
        rows.append([step, step * cfg.batch_size, M.EVAL_LOSS, loss, train_seconds, time.time()])
        last[M.EVAL_LOSS] = loss
        first_eval = loss if first_eval is None else first_eval
        return eval_status(loss, first_eval, cfg.divergence_factor, cfg.target_loss)

    def report(final: bool) -> None:
        metrics = {
            M.STEP: step,
            M.MICRO_STEP: step * cfg.accum,
            M.EXAMPLES: step * cfg.batch_size,
            M.EPOCH: 0.0,  # the NQM samples fresh examples: no epochs
            "status": status,
            "train_seconds": train_seconds,
            "startup_seconds": startup,
            "worker_pid": os.getpid(),  # which process trained (a restarted worker shows a new pid)
            **last,
            "rows": list(rows),
        }
        rows.clear()
        if not (final or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0)):
            session.report(metrics, None)
            return
        with tempfile.TemporaryDirectory(prefix="bcrit-nqm-") as d:
            state = {
                "theta": theta.tolist(),
                "step": step,
                "first_eval": first_eval,
                "train_seconds": train_seconds,
                "status": status,
                "rng": rng.bit_generator.state,
            }
            with open(os.path.join(d, STATE_FILE), "w") as f:
                json.dump(state, f)
            session.report(metrics, d)

    if status != M.STATUS_RUNNING:  # restored from a final checkpoint: nothing left to do
        report(final=True)
    elif step == 0 and first_eval is None:
        status = evaluate()
        report(final=status != M.STATUS_RUNNING)
    while status == M.STATUS_RUNNING:
        t0 = time.perf_counter()
        with np.errstate(over="ignore", invalid="ignore"):
            theta = theta - cfg.lr * (h * theta + sd * rng.standard_normal(cfg.dim))
        step += 1
        if cfg.step_seconds:
            time.sleep(cfg.step_seconds)
        train_seconds += time.perf_counter() - t0
        status = status_after_step(step, cfg.eval_every, cfg.max_steps, evaluate)
        final = status != M.STATUS_RUNNING
        if final or step % cfg.report_interval == 0:
            report(final)
    return {"status": status, M.STEP: step, "last": dict(last), "pid": os.getpid()}


def train_func(config: dict) -> dict:
    """The Ray Train per-worker function (V2): ``config = {"trial": cfg_dict}``."""
    from trainables.trial import RaySession

    return train_loop(QuadraticConfig.from_dict(config["trial"]), RaySession())
