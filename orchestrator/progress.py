"""What a person reads in the terminal while a sweep or a trial runs.

- One line per trial event: ``[3/16] B=64 (32x1x2) lr=2e-3: reached 0.22 in 70 steps, 37 s`` (finished: reached /
  budget spent / diverged; failed; retried). ``k/N``: trials finished so far of the sweep's total.
- A live progress bar: on a terminal one line redrawn in place (``done / running / pending``, elapsed, ETA); when
  the output is a file or a pipe, the same as a plain line at most once a minute.
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

from analysis import metrics as M

BAR_WIDTH = 24
PLAIN_EVERY_S = 60.0  # a non-terminal output gets the status line at most this often
REDRAW_EVERY_S = 0.5


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
    return f"{status} at step {step}"


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    n = int(round(max(0.0, min(1.0, fraction)) * width))
    return "#" * n + "." * (width - n)


# --- the sweep ---------------------------------------------------------------------------------------------------
def _callback_base():
    from ray.tune import Callback

    return Callback


class SweepProgress(_callback_base()):
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
        self._done_here = 0  # trials finished by this driver (the ETA's rate; a resumed sweep starts at 0)
        self._finished: dict[str, str] = {}  # trial_id -> final status seen
        self._counts = (0, 0)  # (done, running) at the last event
        self._last_draw = -math.inf
        self._bar_shown = False

    # pickling (Tune saves the run config with its callbacks): the stream is the process's stdout again
    def __getstate__(self):
        return {**self.__dict__, "_stream": None, "_start": None, "_bar_shown": False, "_last_draw": -math.inf}

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    @property
    def tty(self) -> bool:
        if self._tty is not None:
            return self._tty
        try:
            return self.stream.isatty()
        except (AttributeError, ValueError):
            return False

    # --- state ---
    def _count(self, trials) -> tuple[int, int]:
        done = running = 0
        for t in trials:
            if t.trial_id in self._finished or t.status in ("TERMINATED", "ERROR"):
                done += 1
            elif t.status == "RUNNING":
                running += 1
        return min(done, self.total), running

    def status_text(self, done: int, running: int, now: float) -> str:
        pending = max(0, self.total - done - running)
        elapsed = now - (self._start if self._start is not None else now)
        eta = None
        if self._done_here and elapsed > 0 and done < self.total:
            eta = (self.total - done) * elapsed / self._done_here
        elif done >= self.total:
            eta = 0.0
        return (
            f"[{bar(done / max(self.total, 1))}] {done}/{self.total} done, {running} running, {pending} pending"
            f"  {fmt_seconds(elapsed)} elapsed, ETA {fmt_seconds(eta)}"
        )

    # --- output ---
    def _clear(self) -> None:
        if self._bar_shown:
            self.stream.write("\r\x1b[K")
            self._bar_shown = False

    def _draw(self, trials, force: bool = False) -> None:
        if not self.live:
            return
        now = self._clock()
        every = REDRAW_EVERY_S if self.tty else PLAIN_EVERY_S
        if not force and now - self._last_draw < every:
            return
        self._last_draw = now
        done, running = self._count(trials)
        text = self.status_text(done, running, now)
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
            self._bar_shown = True
        else:
            self.stream.write(f"[bcrit] {text}\n")
        self.stream.flush()

    def line(self, text: str, trials=()) -> None:
        """An event line above the bar."""
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()
        if self.tty:
            self._draw(trials, force=True)

    # --- Tune hooks ---
    def setup(self, **info) -> None:
        self._start = self._clock()

    def on_step_end(self, iteration, trials, **info) -> None:
        if self._start is None:
            self._start = self._clock()
        self._draw(trials)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        status = result.get("status", M.STATUS_RUNNING)
        if status == M.STATUS_RUNNING or trial.trial_id in self._finished:
            return
        self._finished[trial.trial_id] = status
        self._done_here += 1
        done, _ = self._count(trials)
        took = result.get("time_total_s")
        cfg = trial.config["trial"]
        self.line(f"[{done}/{self.total}] {trial_label(cfg)}: {outcome_text(cfg, result)}, {fmt_seconds(took)}", trials)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        if trial.trial_id not in self._finished:
            self._finished[trial.trial_id] = M.STATUS_FAILED
            self._done_here += 1
        done, _ = self._count(trials)
        where = trial.error_file or trial.path or "see the Tune log"
        self.line(f"[{done}/{self.total}] {trial_label(trial.config['trial'])}: FAILED, error in {where}", trials)

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        done, _ = self._count(trials)
        self.line(f"[{done}/{self.total}] {trial_label(trial.config['trial'])}: error, retrying", trials)

    def on_experiment_end(self, trials, **info) -> None:
        self._clear()
        counts: dict[str, int] = {}
        for t in trials:
            s = self._finished.get(t.trial_id) or (t.last_result or {}).get("status") or t.status.lower()
            counts[s] = counts.get(s, 0) + 1
        elapsed = self._clock() - (self._start if self._start is not None else self._clock())
        parts = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        self.stream.write(f"[bcrit] {len(trials)}/{self.total} trials finished in {fmt_seconds(elapsed)}: {parts}\n")
        self.stream.flush()


class StripRows(_callback_base()):
    """The last bcrit callback: removes the ``rows`` payload from each result once tracking and tables have it,
    so Tune's own result files (``result.json``, ``progress.csv``, TensorBoard) and experiment state hold only
    the scalars. Tune passes the same result dict to every callback and then keeps it as ``trial.last_result``."""

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        result.pop("rows", None)


# --- one trial: `bcrit train` ----------------------------------------------------------------------------------
PROGRESS_KEYS = (M.STEP, M.EXAMPLES, M.EVAL_LOSS, "status", "train_seconds")


def _user_callback_base():
    from ray.train import UserCallback

    return UserCallback


class ProgressFileCallback(_user_callback_base()):
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


def train_status_text(p: dict, max_steps: int, target: float | None, elapsed: float) -> str:
    step = int(p.get(M.STEP) or 0)
    loss = p.get(M.EVAL_LOSS)
    goal = f" (target {target})" if target is not None else ""
    loss_s = f"eval/loss {loss:.4g}{goal}" if loss is not None else f"eval/loss --{goal}"
    train_s = p.get("train_seconds")
    eta = None
    if step and train_s:
        eta = (max_steps - step) * float(train_s) / step
    return (
        f"[{bar(step / max(max_steps, 1))}] step {step}/{max_steps}  {loss_s}  {fmt_seconds(elapsed)} elapsed, "
        f"ETA <= {fmt_seconds(eta)} (budget)"
    )


class TrainProgress:
    """Draws the bar of one trial from the progress file while ``fit`` runs (a daemon thread)::

    with TrainProgress(path, cfg.max_steps, cfg.target_loss):
        trainer.fit()
    """

    def __init__(self, path: str, max_steps: int, target: float | None, stream: TextIO | None = None):
        self.path, self.max_steps, self.target = path, max_steps, target
        self.stream = stream or sys.stdout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.monotonic()
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False

    def read(self) -> dict | None:
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _run(self) -> None:
        last_plain = -math.inf
        while not self._stop.wait(REDRAW_EVERY_S):
            p = self.read()
            if p is None:
                continue
            text = train_status_text(p, self.max_steps, self.target, time.monotonic() - self._start)
            if self.tty:
                self.stream.write("\r\x1b[K" + text)
                self.stream.flush()
            elif time.monotonic() - last_plain >= PLAIN_EVERY_S:
                last_plain = time.monotonic()
                self.stream.write(text + "\n")
                self.stream.flush()

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, name="bcrit-train-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
