"""The per-worker training loop of one trial: build, (restore), train, evaluate, decide to stop, report.

It talks to its runner through a small ``Session`` (rank, world size, device, report, checkpoint to resume),
so the same loop runs inside a Ray Train worker (`trainables.trial`) and in-process for fast tests.

Every report carries the counters (``step``, ``micro_step``, ``examples``, ``epoch``), ``status``, the latest
scalars, and ``rows``: every value recorded since the previous report as ``[step, examples, metric, value,
wall_time, unix_time]`` (the long format of ``metrics.parquet``; ``unix_time``: when it was measured, for
MLflow). A trial stops itself -- budget spent, target reached, diverged -- so the trainer returns normally
(REFERENCE.md: the placement-group leak when Tune stops trials).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Protocol

import torch

from analysis import metrics as M
from analysis.gns import GNSWindow, live_metrics
from trainables import branching, checkpoint
from trainables.compiling import compile_model
from trainables.config import TrialConfig
from trainables.data import load_dataset
from trainables.diffusion import make_scheduler
from trainables.evaluation import HeldOutEval
from trainables.gns_stats import LocalGradNormHook
from trainables.presets import build_dit
from trainables.row_log import RowLog
from trainables.step import TrainStep, global_gns_available
from trainables.stopping import eval_status, status_after_step
from trainables.sys_metrics import SysMetrics
from trainables.timing import StepTimer

GNS_UNAVAILABLE = (
    "unavailable: global GNS needs num_workers x grad_accum >= 2, or gns_halves with micro_batch_size >= 2 "
    "(this trial has 1 x 1)"
)


class Session(Protocol):
    rank: int
    world_size: int
    device: torch.device

    def report(self, metrics: dict, checkpoint_dir: str | None) -> None: ...
    def restore(self) -> contextlib.AbstractContextManager[str | None]: ...


def _autocast(cfg: TrialConfig, device: torch.device):
    if device.type == "cuda" and cfg.bf16:
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def train_loop(cfg: TrialConfig, session: Session) -> dict:
    """Run the trial on this worker; returns the summary (identical on every rank)."""
    rank, world, device = session.rank, session.world_size, session.device
    torch.set_num_threads(cfg.threads_per_worker or cfg.cpus_per_worker)
    t_start = time.perf_counter()
    # 1. data, model (same init on every rank), DDP, optimizer, schedules
    data = load_dataset(cfg.dataset, cfg.eval_size)
    info = data.info
    torch.manual_seed(cfg.seed)
    model = build_dit(cfg.preset, sample_size=info.image_size, in_channels=info.channels, num_classes=info.num_classes)
    model = model.to(device).train()
    if cfg.compile:
        compile_model(model, device)  # in place: state_dict keys unchanged (trainables.compiling)
    ddp, hook = model, None
    if world > 1:
        ids = [device.index] if device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if cfg.gns:
            hook = LocalGradNormHook()
            hook.register(ddp)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
    )
    from diffusers.optimization import get_constant_schedule_with_warmup
    from diffusers.training_utils import EMAModel

    lr_sched = get_constant_schedule_with_warmup(opt, num_warmup_steps=cfg.warmup_steps)
    ema = EMAModel(model.parameters(), decay=cfg.ema_decay) if cfg.ema_decay else None
    gns_ema = GNSWindow(cfg.gns_steps, cfg.gns_window_half)  # global B_simple's window (checkpoint key "gns_ema")
    scheduler = make_scheduler()
    autocast = _autocast(cfg, device)
    evaluator = HeldOutEval(data, cfg.eval_repeats, cfg.timestep_bins, rank, world, device)
    train_step = TrainStep(cfg, model, ddp, data, scheduler, rank, world, device, autocast, hook)
    bin_gns = None
    if cfg.gns_every:
        from trainables.gns_bins import BinGNS

        bin_gns = BinGNS(cfg, model, data, scheduler, rank, world, device, autocast)

    # 2. restore
    step, first_eval, train_seconds, status = 0, None, 0.0, M.STATUS_RUNNING
    last: dict[str, float] = {}
    row_log = RowLog()  # every row reported, carried by checkpoints (trainables.row_log)
    with session.restore() as ckpt_dir:
        if ckpt_dir:
            state = checkpoint.load(ckpt_dir, rank)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            lr_sched.load_state_dict(state["lr_scheduler"])
            if ema is not None:
                ema.load_state_dict(state["ema"])
            gns_ema.load_state_dict(state["gns_ema"])
            if bin_gns is not None:
                bin_gns.load_state_dict(state["bin_gns"])
            step, first_eval, train_seconds = state["step"], state["first_eval"], state["train_seconds"]
            last = state["last"]
            row_log.load_state_dict(state.get("row_log"))
            # a finished trial re-run (e.g. by Tune after a driver crash) trains no further; a larger max_steps
            # extends a trial whose budget was spent
            status = state.get("status", M.STATUS_RUNNING)
            if status == M.STATUS_BUDGET_SPENT and step < cfg.max_steps:
                status = M.STATUS_RUNNING
        elif cfg.init_from:  # a branch of a branched study: counters start at 0 (trainables.branching)
            branching.start_dit(cfg.init_from, cfg.lr, model, opt, ema)
    startup_seconds = time.perf_counter() - t_start
    rows: list[list] = []
    resend = row_log.rows()  # after a restore: sent again once with the next report (watermarks drop duplicates)

    def record(name: str, value: float) -> None:
        rows.append([step, step * cfg.batch_size, name, float(value), train_seconds, time.time()])
        last[name] = float(value)

    def evaluate() -> str:
        nonlocal first_eval
        if ema is not None and cfg.eval_ema:
            ema.store(model.parameters())
            ema.copy_to(model.parameters())
        loss, per_bin = evaluator(model, scheduler, autocast)
        if ema is not None and cfg.eval_ema:
            ema.restore(model.parameters())
        record(M.EVAL_LOSS, loss)
        for k, v in enumerate(per_bin):
            record(M.per_bin(M.EVAL_LOSS_BIN, k), v)
        first_eval = loss if first_eval is None else first_eval
        return eval_status(loss, first_eval, cfg.divergence_factor, cfg.target_loss)

    def report(final: bool, save: bool | None = None) -> None:
        nonlocal resend
        if save is None:
            save = final or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
        metrics = {
            M.STEP: step,
            M.MICRO_STEP: step * cfg.accum,
            M.EXAMPLES: step * cfg.batch_size,
            M.EPOCH: step * cfg.batch_size / info.train_size,
            "status": status,
            "train_seconds": train_seconds,
            "startup_seconds": startup_seconds,
            **last,
            "rows": resend + rows,
        }
        row_log.add(rows)
        resend, rows[:] = [], []
        if not save:
            session.report(metrics, None)
            return
        with tempfile.TemporaryDirectory(prefix="bcrit-ckpt-") as d:
            state = None
            if rank == 0:
                state = {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "lr_scheduler": lr_sched.state_dict(),
                    "ema": ema.state_dict() if ema is not None else None,
                    "gns_ema": gns_ema.state_dict(),
                    "bin_gns": bin_gns.state_dict() if bin_gns is not None else None,
                    "step": step,
                    "first_eval": first_eval,
                    "train_seconds": train_seconds,
                    "last": dict(last),
                    "status": status,
                    "config": cfg.to_dict(),
                    "dataset_info": vars(info),
                    "row_log": row_log.state_dict(),
                }
            checkpoint.save(d, rank, state)
            branching.keep_checkpoint(cfg.keep_dir, cfg.keep_steps, step, d)
            session.report(metrics, d)

    # 3. train until a stop rule fires
    if status != M.STATUS_RUNNING:  # resumed from a final checkpoint: say so once, train nothing
        report(final=True, save=False)
    if step == 0 and first_eval is None:
        status = evaluate()
        report(final=status != M.STATUS_RUNNING)
    timer = StepTimer(device)  # CUDA events on a GPU (no extra sync), wall clock on CPU
    sys_metrics = SysMetrics(device, cfg.batch_size, step, train_seconds)  # sys/* of each report interval
    while status == M.STATUS_RUNNING:
        timer.start()
        lr = lr_sched.get_last_lr()[0]
        s = train_step(step)
        if s.finite:
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grads_with_norm_(train_step.params, cfg.grad_clip, torch.tensor(s.g2_big**0.5))
            opt.step()
            lr_sched.step()
            if ema is not None:
                ema.step(model.parameters())
        opt.zero_grad(set_to_none=True)
        step += 1
        bin_values = bin_gns.measure(step) if bin_gns is not None and step % cfg.gns_every == 0 else {}
        train_seconds += timer.stop()  # training time includes the GNS measurements
        record(M.TRAIN_LOSS, s.loss)
        record(M.LR, lr)
        record(M.GRAD_NORM, s.g2_big**0.5)
        if s.g2_small is not None and s.finite:  # a non-finite step ends the trial as diverged below
            bin_values = {**live_metrics(gns_ema, step, s.g2_small, s.g2_big, s.b_small, s.b_big), **bin_values}
        for name, value in bin_values.items():
            record(name, value)
        if s.finite:
            status = status_after_step(step, cfg.eval_every, cfg.max_steps, evaluate)
        else:
            status = M.STATUS_DIVERGED
        final = status != M.STATUS_RUNNING
        if final or step % cfg.report_interval == 0:
            train_seconds += timer.flush()
            for name, value in sys_metrics.interval(step, train_seconds).items():
                record(name, value)
            report(final)
    train_step.close()

    return {
        "status": status,
        M.STEP: step,
        M.MICRO_STEP: step * cfg.accum,
        M.EXAMPLES: step * cfg.batch_size,
        M.EPOCH: step * cfg.batch_size / info.train_size,
        "batch_size": cfg.batch_size,
        "micro_batch_size": cfg.micro_batch_size,
        "grad_accum": cfg.accum,
        "num_workers": cfg.num_workers,
        "train_seconds": train_seconds,
        "startup_seconds": startup_seconds,
        "gns_window": cfg.gns_steps,
        "gns_window_half": cfg.gns_window_half,
        "gns_global": "on" if global_gns_available(cfg) else (GNS_UNAVAILABLE if cfg.gns else "off"),
        "last": dict(last),
        "pid": os.getpid(),
    }
