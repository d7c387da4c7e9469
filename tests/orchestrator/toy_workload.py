"""A workload in one file, as a user adds one (docs/architecture.md, "Where new things go"): a spec names it
``workload: tests.orchestrator.toy_workload:WORKLOAD`` and `bcrit sweep` runs it (tests/orchestrator/test_workloads.py).

The toy: estimate the mean ``mu`` of N(mu, 1) by SGD on ``½ E(theta - x)²``: a step at batch size B moves
``theta`` by ``lr x (theta - mean of B draws)``; the held-out loss is the exact expected excess ``½ (theta - mu)²``,
``½ mu²`` at the start (``theta = 0``)."""

from __future__ import annotations

import json
import os
import time
from typing import ClassVar

import numpy as np

from analysis.core import metrics as M
from trainables.config import LR_RULE, POS, POSITIVE, BaseConfig, ConfigError, Float, config_class
from trainables.skeleton import Learner, Session, StepOutcome, TrialSkeleton
from trainables.workloads import Workload

STATE_FILE = "toy_state.json"


@config_class
class ToyConfig(BaseConfig):
    mu: Float() = 2.0  # the mean to estimate
    schedule_lr_rule: LR_RULE = "linear"  # SGD
    lr: POSITIVE = 0.5
    eval_every: POS = 1

    WHAT: ClassVar[str] = "toy config"


def check_toy(cfg: ToyConfig, resources: dict | None = None) -> None:
    if cfg.use_gpu:
        raise ConfigError("the toy workload runs on CPU; set use_gpu: false")


class ToyLearner(Learner):
    def __init__(self, cfg: ToyConfig):
        self.cfg, self.theta, self.rng = cfg, 0.0, np.random.default_rng(cfg.seed)

    def step(self, step: int) -> StepOutcome:
        t0 = time.perf_counter()
        b = self.cfg.stages.batch(step)
        lr = self.cfg.stages.lr(step, self.cfg.lr, self.cfg.schedule_lr_rule)
        self.theta -= lr * (self.theta - float(self.rng.normal(self.cfg.mu, 1.0, b).mean()))
        return StepOutcome(time.perf_counter() - t0)

    def evaluate(self) -> dict[str, float]:
        return {M.EVAL_LOSS: 0.5 * (self.theta - self.cfg.mu) ** 2}

    def state_dict(self) -> dict:
        return {"theta": self.theta, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.theta, self.rng.bit_generator.state = state["theta"], state["rng"]

    def save(self, directory: str, state) -> None:
        with open(os.path.join(directory, STATE_FILE), "w") as f:
            json.dump(state(), f, default=lambda a: a.tolist())

    def load(self, directory: str) -> dict:
        with open(os.path.join(directory, STATE_FILE)) as f:
            return json.load(f)


def train_loop(cfg: ToyConfig, session: Session) -> dict:
    trial = TrialSkeleton(cfg, session, ToyLearner(cfg), time.perf_counter())
    trial.restore()
    status = trial.run()
    return {"status": status, M.STEP: trial.step, "pid": os.getpid()}


WORKLOAD = Workload("toy", ToyConfig, train_loop, check_toy)
