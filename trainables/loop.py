"""The DiT trial on one worker: build, (restore), train, evaluate, decide to stop, report.

`train_loop` builds a `DiTLearner` (data, model, DDP, optimizer, schedules, evaluation, GNS) and hands it to the
trial skeleton (`trainables.skeleton`), which keeps the counters, rows, reports, checkpoints and stop rules shared
with the quadratic workload. It talks to its runner through a small ``Session`` (rank, world size, device, report,
checkpoint to resume), so the same loop runs inside a Ray Train worker (`trainables.trial`) and in-process for
fast tests.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

from analysis.core import metrics as M
from analysis.core.gns import GNSWindow, live_metrics
from trainables import branch_points, checkpoint
from trainables.compiling import compile_model
from trainables.config import GLOBAL_MIN_MEASUREMENTS, TrialConfig
from trainables.data import load_dataset
from trainables.diffusion import NUM_TIMESTEPS, make_scheduler
from trainables.evaluation import HeldOutEval
from trainables.gns_stats import LocalGradNormHook
from trainables.lr_schedule import lr_schedule
from trainables.presets import build_dit
from trainables.skeleton import Learner, Session, StepOutcome, TrialSkeleton
from trainables.step import TrainStep, global_gns_available
from trainables.sys_metrics import SysMetrics
from trainables.timing import StepTimer

GNS_UNAVAILABLE = (
    "unavailable: global GNS needs num_workers x grad_accum >= 2, or gns_halves with micro_batch_size >= 2 "
    "(this trial has 1 x 1)"
)


def global_gns_summary(cfg: TrialConfig, window: GNSWindow) -> str:
    """The summary's ``gns_global``: ``off``, ``unavailable: ...``, or ``on: <mode>, <cadence>`` per batch-size stage
    (`TrialConfig.global_gns_stages`), plus a warning when the last window holds fewer than
    ``GLOBAL_MIN_MEASUREMENTS`` measurements (a trial too short for its cadence: its B_simple is noise)."""
    if not global_gns_available(cfg):
        return GNS_UNAVAILABLE if cfg.gns else "off"
    parts = []
    for mode, k in dict.fromkeys(cfg.global_gns_stages):  # distinct stages, in order
        parts.append(mode if k == 0 else f"{mode}, every step" if k == 1 else f"{mode}, every {k} steps")
    out = "on: " + "; then ".join(parts)
    n = window.estimate.n
    if n < GLOBAL_MIN_MEASUREMENTS:
        out += (
            f" (only {n} measurement{'s' * (n != 1)} in the last window, fewer than {GLOBAL_MIN_MEASUREMENTS}: its "
            "B_simple ± SE is noise; train longer, or lower gns_global_every: 1 = every step)"
        )
    return out


def _autocast(cfg: TrialConfig, device: torch.device):
    if device.type == "cuda" and cfg.bf16:
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


class DiTLearner(Learner):
    """A diffusers DiT trained with AdamW (EMA, warm-up, clipping, GNS) on one worker of ``world``."""

    def __init__(self, cfg: TrialConfig, rank: int, world: int, device: torch.device):
        from diffusers.training_utils import EMAModel

        self.cfg, self.rank, self.world, self.device = cfg, rank, world, device
        # data, model (same init on every rank), DDP, optimizer, schedules
        self.data = load_dataset(cfg.dataset, cfg.eval_size)
        info = self.data.info
        self.train_size = info.train_size
        torch.manual_seed(cfg.seed)
        model = build_dit(
            cfg.preset, sample_size=info.image_size, in_channels=info.channels, num_classes=info.num_classes
        )
        self.model = model = model.to(device).train()
        if cfg.compile:
            compile_model(model, device)  # in place: state_dict keys unchanged (trainables.compiling)
        ddp, hook = model, None
        if world > 1:
            ids = [device.index] if device.type == "cuda" else None
            ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
            if cfg.gns:
                hook = LocalGradNormHook()
                hook.register(ddp)
        betas = (cfg.beta1, cfg.beta2)
        self.opt = torch.optim.AdamW(  # foreach: the multi-tensor update, bit for bit the per-tensor one on a CPU
            model.parameters(), lr=cfg.lr, betas=betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay, foreach=True
        )
        self.lr_sched = lr_schedule(self.opt, cfg)  # warm-up, times the batch-size stage's factor
        self.ema = EMAModel(model.parameters(), decay=cfg.ema_decay) if cfg.ema_decay else None
        self.gns_window = GNSWindow(cfg.gns_steps, cfg.gns_window_half)  # global B_simple's window (key "gns_ema")
        self.scheduler = make_scheduler()
        self.autocast = _autocast(cfg, device)
        self.evaluator = HeldOutEval(self.data, cfg.eval_repeats, cfg.timestep_bins, rank, world, device)
        data, scheduler, autocast = self.data, self.scheduler, self.autocast
        self.sampler = None  # timestep_sampling uniform: the original draws (trainables.timestep_sampler)
        if cfg.timestep_sampling != "uniform":
            from trainables.timestep_sampler import TimestepSampler

            self.sampler = TimestepSampler(cfg, NUM_TIMESTEPS, device)
        self.adaln, self.adaln_windows = None, None  # adaLN-gradient GNS (trainables.gns_adaln); not with compile
        if cfg.gns_adaln and not cfg.compile:
            from analysis.core.gns_pairs import AdaLNWindows
            from trainables.gns_adaln import AdaLNCollector

            self.adaln = AdaLNCollector(model, cfg.timestep_bins, device)
            self.adaln_windows = AdaLNWindows(cfg.timestep_bins, cfg.gns_steps, cfg.gns_window_half)
        args = (cfg, model, ddp, data, scheduler, rank, world, device, autocast, hook, self.sampler, self.adaln)
        self.train_step = TrainStep(*args)
        self.bin_gns = None
        if cfg.gns_every:
            from trainables.gns_bins import BinGNS

            self.bin_gns = BinGNS(cfg, model, data, scheduler, rank, world, device, autocast)

    # --- training and evaluation -----------------------------------------------------------------------------
    def start(self, step: int, train_seconds: float) -> None:
        self.timer = StepTimer(self.device)  # CUDA events on a GPU (no extra sync), wall clock on CPU
        cfg = self.cfg
        self.sys_metrics = SysMetrics(self.device, cfg.batch_size, step, train_seconds, cfg.stages)  # sys/* per report

    def step(self, step: int) -> StepOutcome:
        cfg, opt = self.cfg, self.opt
        self.timer.start()
        lr = self.lr_sched.get_last_lr()[0]
        s = self.train_step(step)
        if s.finite:
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grads_with_norm_(self.train_step.params, cfg.grad_clip, torch.tensor(s.g2_big**0.5))
            opt.step()
            self.lr_sched.step()
            if self.ema is not None:
                self.ema.step(self.model.parameters())
        opt.zero_grad(set_to_none=True)
        done = step + 1
        measure_bins = self.bin_gns is not None and done % cfg.gns_every == 0
        bin_values = self.bin_gns.measure(done) if measure_bins else {}
        if self.sampler is not None:  # re-estimate the allocation (after this step's per-bin measurement)
            bin_values.update(self.sampler.update(done, self.bin_gns.windows if self.bin_gns else ()))
        if s.adaln is not None and s.finite:  # every step into the window; logged at each report (interval)
            self.adaln_windows.update(done, s.adaln)
        seconds = self.timer.stop()  # training time includes the GNS measurements
        values = {M.TRAIN_LOSS: s.loss, M.LR: lr, M.GRAD_NORM: s.g2_big**0.5}
        if s.g2_small is not None and s.finite:  # a non-finite step ends the trial as diverged
            live = live_metrics(self.gns_window, done, s.g2_small, s.g2_big, s.b_small, s.b_big)
            bin_values = {**live, **bin_values}
        return StepOutcome(seconds, {**values, **bin_values}, s.finite)

    def evaluate(self) -> dict[str, float]:
        model, ema = self.model, self.ema if self.cfg.eval_ema else None
        if ema is not None:
            ema.store(model.parameters())
            ema.copy_to(model.parameters())
        loss, per_bin = self.evaluator(model, self.scheduler, self.autocast)
        if ema is not None:
            ema.restore(model.parameters())
        return {M.EVAL_LOSS: loss, **{M.per_bin(M.EVAL_LOSS_BIN, k): v for k, v in enumerate(per_bin)}}

    def flush(self) -> float:
        return self.timer.flush()

    def interval(self, step: int, train_seconds: float) -> dict[str, float]:
        out = self.sys_metrics.interval(step, train_seconds)
        if self.adaln_windows is not None:
            out.update(self.adaln_windows.metrics())
        return out

    def close(self) -> None:
        self.train_step.close()

    # --- checkpoints (trainables.checkpoint: rank 0's state, every rank's RNG) --------------------------------
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "lr_scheduler": self.lr_sched.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "gns_ema": self.gns_window.state_dict(),
            "bin_gns": self.bin_gns.state_dict() if self.bin_gns is not None else None,
            "timestep_sampler": self.sampler.state_dict() if self.sampler is not None else None,
            "gns_adaln": self.adaln_windows.state_dict() if self.adaln_windows is not None else None,
            "config": self.cfg.to_dict(),
            "dataset_info": vars(self.data.info),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.lr_sched.load_state_dict(state["lr_scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])  # shadow params as the checkpoint holds them: on the CPU
            self.ema.to(device=next(self.model.parameters()).device)  # (resume on a GPU failed without this)
        self.gns_window.load_state_dict(state["gns_ema"])
        if self.bin_gns is not None:
            self.bin_gns.load_state_dict(state["bin_gns"])
        if self.sampler is not None:
            self.sampler.load_state_dict(state.get("timestep_sampler"))
        if self.adaln_windows is not None:
            self.adaln_windows.load_state_dict(state.get("gns_adaln"))

    def save(self, directory: str, state) -> None:
        checkpoint.save(directory, self.rank, state() if self.rank == 0 else None)

    def load(self, directory: str) -> dict:
        return checkpoint.load(directory, self.rank)  # also restores this rank's RNG states

    def branch_from(self, init_from: str) -> None:
        branch_points.start_dit(init_from, self.cfg.lr, self.model, self.opt, self.ema)


def train_loop(cfg: TrialConfig, session: Session) -> dict:
    """Run the trial on this worker; returns the summary (identical on every rank)."""
    world = session.world_size
    torch.set_num_threads(cfg.threads_per_worker or cfg.cpus_per_worker)
    started = time.perf_counter()
    learner = DiTLearner(cfg, session.rank, world, session.device)  # 1. build
    trial = TrialSkeleton(cfg, session, learner, started)
    trial.restore()  # 2. restore (or branch from init_from)
    status = trial.run()  # 3. train until a stop rule fires
    return {
        "status": status,
        **trial.counters(),
        "batch_size": cfg.batch_size,
        "micro_batch_size": cfg.micro_batch_size,
        "grad_accum": cfg.accum,
        "num_workers": cfg.num_workers,
        "train_seconds": trial.train_seconds,
        "startup_seconds": trial.startup_seconds,
        "gns_window": cfg.gns_steps,
        "gns_window_half": cfg.gns_window_half,
        "gns_global": global_gns_summary(cfg, learner.gns_window),
        "gns_adaln": "on" if learner.adaln is not None else "off (compile: true)" if cfg.gns_adaln else "off",
        "last": dict(trial.last),
        "pid": os.getpid(),
    }
