"""What a person reads in the terminal while a sweep or a trial runs.

- One line per trial event, printed by bcrit: ``[3/16] B=64 (32x1x2) lr=2e-3: reached 0.22 in 70 steps, 37 s``
  (finished: reached / budget spent / diverged / ended at the adaptive sweep's goal; failed; retried). ``k/N``:
  trials finished so far of the total.
- A live progress bar, drawn by tqdm: on a terminal one line redrawn in place (``done / running / pending``,
  elapsed, ETA) at most every `REDRAW_EVERY_S`; when the output is a file or a pipe, the same as a plain
  ``[bcrit] ...`` line at most every `PLAIN_EVERY_S` (`LogLines`: tqdm redraws with a carriage return, which a
  log would keep as one ever-growing line). The ETA is tqdm's: what is left at the average rate since the bar
  started (a resumed sweep's bar starts from the trials already done).
- `SweepProgress` is a Ray Tune callback (the driver); `TrainProgress` draws the bar of ``bcrit train`` from the
  small progress file that `ProgressFileCallback` (a Ray Train callback, run by Train's controller on the driver's
  node) rewrites after every report.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from ray.train import UserCallback
from ray.tune import Callback
from tqdm import tqdm

from analysis.core import metrics as M

PLAIN_EVERY_S = 60.0  # a non-terminal output gets the status line at most this often
REDRAW_EVERY_S = 0.5  # a terminal's bar is redrawn at most this often
SWEEP_BAR = "[{bar:24}] {n}/{total} done{postfix}  {elapsed} elapsed, ETA {remaining}"
TRAIN_BAR = "[{bar:24}] step {n}/{total}{postfix}  {elapsed} since the first report, ETA <= {remaining} (budget)"


# --- formatting --------------------------------------------------------------------------------------------------
def fmt_lr(x: float) -> str:
    """``0.002`` -> ``2e-3``, ``0.0015`` -> ``1.5e-3``, ``0.3`` -> ``0.3``."""
    x = float(x)
    if x == 0 or 1e-2 <= abs(x) < 1e4:
        return f"{x:.3g}"
    mant, exp = f"{x:.2e}".split("e")
    return f"{mant.rstrip('0').rstrip('.')}e{int(exp)}"


def fmt_seconds(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "--"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def trial_label(cfg: dict) -> str:
    """``B=64 (32x1x2) lr=2e-3`` (+ `` seed=1`` for a seed other than 0)."""
    w = max(1, int(cfg.get("num_workers", 0)))
    a = cfg.get("grad_accum") or int(cfg["batch_size"]) // (int(cfg["micro_batch_size"]) * w)
    seed = int(cfg.get("seed", 0) or 0)
    return f"B={cfg['batch_size']} ({cfg['micro_batch_size']}x{a}x{w}) lr={fmt_lr(cfg['lr'])}" + (
        f" seed={seed}" if seed else ""
    )


def outcome_text(cfg: dict, result: dict) -> str:
    status, step = result.get("status"), result.get(M.STEP)
    loss = result.get(M.EVAL_LOSS)
    loss_s = "" if loss is None else f"{loss:.4g}"
    if status == M.STATUS_REACHED_TARGET:
        return f"reached {cfg.get('target_loss')} in {step} steps"
    if status == M.STATUS_BUDGET_SPENT:
        return f"budget spent at {step} steps" + (f", eval/loss {loss_s}" if loss_s else "")
    if status == M.STATUS_DIVERGED:
        return f"diverged at step {step}" + (f" (eval/loss {loss_s})" if loss_s else "")
    if status == M.STATUS_ENDED:
        return f"ended at step {step}: the sweep's goal was met (kept, not fitted)"
    if status == M.STATUS_BEHIND:
        why = result.get("stop_reason") or "behind its batch size's best setting"
        return f"stopped at step {step}, {why} (fitted as censored)"
    return f"{status} at step {step}"


# --- the bar (tqdm) ------------------------------------------------------------------------------------------------
class _Bar(tqdm):
    monitor_interval = 0  # no monitor thread: the callers refresh the bar as their state changes


class LogLines:
    """tqdm's output for a file or a pipe: each refresh as its own ``[bcrit] ...`` line; the carriage returns and
    blank clears of in-place redrawing dropped."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, s: str) -> None:
        text = s.strip()  # tqdm writes CR + text + padding; CR + blanks + CR to clear
        if text:
            self.stream.write(f"[bcrit] {text}\n")

    def flush(self) -> None:
        self.stream.flush()


def is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def make_bar(
    total: int, fmt: str, *, stream: TextIO, tty: bool, initial: int = 0, postfix: str = "", clock=None
) -> tqdm:
    """A tqdm bar on ``stream``: redrawn in place on a terminal, a line per `PLAIN_EVERY_S` otherwise; its rate
    (so its ETA) the average since it started (``smoothing=0``). ``clock``: tqdm's time source (tests)."""
    bar = _Bar(
        total=total,
        initial=initial,
        file=stream if tty else LogLines(stream),
        bar_format=fmt,
        ascii=".#",
        postfix=postfix or None,
        mininterval=REDRAW_EVERY_S if tty else PLAIN_EVERY_S,
        miniters=0,  # redraw on time alone: the counts change rarely, elapsed and ETA all the time
        smoothing=0,
        leave=False,
        position=0,  # one bar per process: a bar still open elsewhere (an earlier driver's) must not push it down
        dynamic_ncols=False,
    )
    if clock is not None:
        bar._time = clock  # tqdm's own tests swap its clock this way
        bar.start_t = bar.last_print_t = clock()
    return bar


# --- the sweep ---------------------------------------------------------------------------------------------------
class SweepProgress(Callback):
    """Event lines and the live bar of a sweep (a Tune callback in the driver). ``live=False``: event lines only
    (``--verbose``, where Tune prints its own tables)."""

    def __init__(
        self,
        total: int,
        *,
        live: bool = True,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
    ):
        self.total = int(total)
        self.live = live
        self._stream = stream
        self._clock = clock
        self._tty = tty
        self._start: float | None = None
        self._finished: dict[str, str] = {}  # trial_id -> final status seen
        self._bar: tqdm | None = None  # made at the first count of the trials (a resumed sweep's start from there)

    # pickling (Tune saves the run config with its callbacks): the stream is the process's stdout again
    def __getstate__(self):
        return {**self.__dict__, "_stream": None, "_start": None, "_bar": None}

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    @property
    def tty(self) -> bool:
        return self._tty if self._tty is not None else is_tty(self.stream)

    # --- state ---
    def _count(self, trials) -> tuple[int, int]:
        done = running = 0
        for t in trials:
            if t.trial_id in self._finished or t.status in ("TERMINATED", "ERROR"):
                done += 1
            elif t.status == "RUNNING":
                running += 1
        return min(done, self.total), running

    def _sync(self, trials, draw: bool = True) -> None:
        """The bar's counts from Tune's trials; ``draw``: redrawn if its interval has passed (tqdm decides)."""
        if not self.live:
            return
        done, running = self._count(trials)
        postfix = f"{running} running, {max(0, self.total - done - running)} pending"
        if self._bar is None:
            self._bar = make_bar(
                self.total,
                SWEEP_BAR,
                stream=self.stream,
                tty=self.tty,
                initial=done,
                postfix=postfix,
                clock=self._clock,
            )
            return
        self._bar.set_postfix_str(postfix, refresh=False)
        if draw:
            self._bar.update(done - self._bar.n)
        else:
            self._bar.n = done

    def line(self, text: str, trials=()) -> None:
        """An event line above the bar (tqdm clears a terminal's bar, prints the line, draws the bar again)."""
        self._sync(trials, draw=False)
        tqdm.write(text, file=self.stream)
        self.stream.flush()

    # --- Tune hooks ---
    def setup(self, **info) -> None:
        self._start = self._clock()

    def on_step_end(self, iteration, trials, **info) -> None:
        if self._start is None:
            self._start = self._clock()
        self._sync(trials)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        status = result.get("status", M.STATUS_RUNNING)
        if status == M.STATUS_RUNNING or trial.trial_id in self._finished:
            return
        self._finished[trial.trial_id] = status
        done, _ = self._count(trials)
        took = result.get("time_total_s")
        cfg = trial.config["trial"]
        self.line(f"[{done}/{self.total}] {trial_label(cfg)}: {outcome_text(cfg, result)}, {fmt_seconds(took)}", trials)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        if trial.trial_id not in self._finished:
            self._finished[trial.trial_id] = M.STATUS_FAILED
        done, _ = self._count(trials)
        where = trial.error_file or trial.path or "see the Tune log"
        self.line(f"[{done}/{self.total}] {trial_label(trial.config['trial'])}: FAILED, error in {where}", trials)

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        done, _ = self._count(trials)
        self.line(f"[{done}/{self.total}] {trial_label(trial.config['trial'])}: error, retrying", trials)

    def on_experiment_end(self, trials, **info) -> None:
        if self._bar is not None:
            self._bar.close()  # leave=False: a terminal's bar line is cleared
            self._bar = None
        counts: dict[str, int] = {}
        for t in trials:
            s = self._finished.get(t.trial_id) or (t.last_result or {}).get("status") or t.status.lower()
            counts[s] = counts.get(s, 0) + 1
        elapsed = self._clock() - (self._start if self._start is not None else self._clock())
        parts = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        self.stream.write(f"[bcrit] {len(trials)}/{self.total} trials finished in {fmt_seconds(elapsed)}: {parts}\n")
        self.stream.flush()


# --- one trial: `bcrit train` ----------------------------------------------------------------------------------
PROGRESS_KEYS = (M.STEP, M.EXAMPLES, M.EVAL_LOSS, "status", "train_seconds")


class ProgressFileCallback(UserCallback):
    """Ray Train callback: after each report, rank 0's counters to a small JSON file (atomically). Train's
    controller runs on the driver's node, so the driver can read the file."""

    def __init__(self, path: str):
        self.path = path

    def after_report(self, run_context, metrics, checkpoint) -> None:
        write_progress(self.path, metrics[0] if metrics else {})


def write_progress(path: str, metrics: dict) -> None:
    data = {k: metrics.get(k) for k in PROGRESS_KEYS if k in metrics}
    data["time"] = time.time()
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def train_postfix(p: dict, target: float | None) -> str:
    """``eval/loss 0.25 (target 0.22)`` after the step count of the bar of ``bcrit train``."""
    loss = p.get(M.EVAL_LOSS)
    goal = f" (target {target})" if target is not None else ""
    return f"eval/loss {loss:.4g}{goal}" if loss is not None else f"eval/loss --{goal}"


class TrainProgress:
    """Draws the bar of one trial from the progress file while ``fit`` runs (a daemon thread polls it)::

    with TrainProgress(path, cfg.max_steps, cfg.target_loss):
        trainer.fit()

    The bar starts at the first report, so Ray's and the trainer's start-up are not in its rate: its ETA is to
    ``max_steps`` (the budget; a trial that reaches its target stops sooner)."""

    def __init__(
        self, path: str, max_steps: int, target: float | None, stream: TextIO | None = None, tty=None, clock=None
    ):
        self.path, self.max_steps, self.target = path, max_steps, target
        self.stream = stream or sys.stdout
        self.tty = is_tty(self.stream) if tty is None else tty
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: tqdm | None = None

    def read(self) -> dict | None:
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def show(self, p: dict) -> None:
        """One progress report on the bar (made at the first; tqdm redraws it when its interval has passed)."""
        step = int(p.get(M.STEP) or 0)
        postfix = train_postfix(p, self.target)
        if self._bar is None:
            self._bar = make_bar(
                self.max_steps, TRAIN_BAR, stream=self.stream, tty=self.tty, initial=step, postfix=postfix,
                clock=self._clock,
            )  # fmt: skip
            return
        self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.update(step - self._bar.n)

    def _run(self) -> None:
        while not self._stop.wait(REDRAW_EVERY_S):
            p = self.read()
            if p is not None:
                self.show(p)

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, name="bcrit-train-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._bar is not None:
            self._bar.close()  # leave=False: a terminal's bar line is cleared
