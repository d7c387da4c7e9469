"""The terminal of a sweep and of one trial (orchestrator.records.progress), driven with fake trials and a fake
clock."""

from __future__ import annotations

import io
import json
import os
from types import SimpleNamespace

from analysis.core import metrics as M
from orchestrator.records.progress import (
    LogLines,
    SweepProgress,
    TrainProgress,
    fmt_lr,
    fmt_seconds,
    make_bar,
    trial_label,
    write_progress,
)
from orchestrator.records.tables_callback import StripRows


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def trial(tid: str, b: int, micro: int, accum: int, workers: int, lr: float, status: str = "PENDING"):
    cfg = {
        "batch_size": b,
        "micro_batch_size": micro,
        "grad_accum": accum,
        "num_workers": workers,
        "lr": lr,
        "seed": 0,
        "target_loss": 0.22,
    }
    return SimpleNamespace(
        trial_id=tid, config={"trial": cfg}, status=status, last_result={}, error_file=None, path=f"/s/{tid}"
    )


def test_formats():
    lrs = (2e-3, 5e-3, 1.5e-4, 0.3, 1.85, 0.01)
    assert [fmt_lr(x) for x in lrs] == ["2e-3", "5e-3", "1.5e-4", "0.3", "1.85", "0.01"]
    assert [fmt_seconds(s) for s in (0.4, 37.2, 75, 3725, None)] == ["0 s", "37 s", "1m15s", "1h02m", "--"]
    assert trial_label(trial("a", 64, 32, 1, 2, 2e-3).config["trial"]) == "B=64 (32x1x2) lr=2e-3"
    assert trial_label({**trial("a", 8, 8, 1, 0, 0.3).config["trial"], "seed": 2}) == "B=8 (8x1x1) lr=0.3 seed=2"


def test_event_lines_count_and_describe_each_outcome():
    out, clock = io.StringIO(), Clock()
    p = SweepProgress(3, stream=out, clock=clock, tty=False, live=False)
    ts = [trial("a", 64, 32, 1, 2, 2e-3), trial("b", 4, 4, 1, 0, 5e-3), trial("c", 16, 16, 1, 0, 2e-3)]
    p.setup()
    reached = {"status": M.STATUS_REACHED_TARGET, M.STEP: 70, M.EVAL_LOSS: 0.219, "time_total_s": 37.2}
    p.on_trial_result(0, ts, ts[0], {"status": M.STATUS_RUNNING, M.STEP: 10})  # no line while running
    p.on_trial_result(0, ts, ts[0], reached)
    p.on_trial_result(0, ts, ts[0], reached)  # a repeated final result is not a second event
    spent = {"status": M.STATUS_BUDGET_SPENT, M.STEP: 150, M.EVAL_LOSS: 0.31, "time_total_s": 80}
    p.on_trial_result(0, ts, ts[1], spent)
    ts[2].error_file = "/s/c/error.txt"
    p.on_trial_error(0, ts, ts[2])
    lines = out.getvalue().splitlines()
    assert lines == [
        "[1/3] B=64 (32x1x2) lr=2e-3: reached 0.22 in 70 steps, 37 s",
        "[2/3] B=4 (4x1x1) lr=5e-3: budget spent at 150 steps, eval/loss 0.31, 1m20s",
        "[3/3] B=16 (16x1x1) lr=2e-3: FAILED, error in /s/c/error.txt",
    ]
    for t, s in zip(ts, ("TERMINATED", "TERMINATED", "ERROR"), strict=True):
        t.status = s
    p.on_experiment_end(ts)
    assert out.getvalue().splitlines()[-1].endswith(": 1 reached target, 1 budget spent, 1 failed")


def test_status_line_counts_and_eta():
    out, clock = io.StringIO(), Clock()
    p = SweepProgress(4, stream=out, clock=clock, tty=False)
    ts = [trial(str(i), 8, 8, 1, 0, 1e-3) for i in range(4)]
    p.setup()
    ts[0].status = ts[1].status = "RUNNING"
    p.on_step_end(0, ts)  # the bar starts: its first line at once
    assert out.getvalue().splitlines() == [
        "[bcrit] [........................] 0/4 done, 2 running, 2 pending  00:00 elapsed, ETA ?"
    ]
    clock.t += 30
    p.on_trial_result(0, ts, ts[0], {"status": M.STATUS_REACHED_TARGET, M.STEP: 5, "time_total_s": 30})
    ts[0].status, ts[2].status = "TERMINATED", "RUNNING"
    p.on_step_end(0, ts)  # a file or a pipe gets the status line at most once a minute
    assert out.getvalue().splitlines()[1:] == ["[1/4] B=8 (8x1x1) lr=1e-3: reached 0.22 in 5 steps, 30 s"]
    clock.t += 30
    p.on_step_end(0, ts)
    # 1 of 4 done in 60 s: 3 left at that rate -> 180 s
    assert out.getvalue().splitlines()[-1] == (
        "[bcrit] [######..................] 1/4 done, 2 running, 1 pending  01:00 elapsed, ETA 03:00"
    )
    n = len(out.getvalue().splitlines())
    clock.t += 59
    p.on_step_end(0, ts)
    assert len(out.getvalue().splitlines()) == n
    clock.t += 2
    p.on_step_end(0, ts)
    assert len(out.getvalue().splitlines()) == n + 1
    for t in ts:
        t.status = "TERMINATED"
    p.on_experiment_end(ts)  # the bar closes without a line of its own; the summary follows
    assert out.getvalue().splitlines()[n + 1].startswith("[bcrit] 4/4 trials finished in 2m")
    assert "\r" not in out.getvalue()


def test_resumed_sweep_eta_counts_only_what_this_driver_finishes():
    out, clock = io.StringIO(), Clock()
    p = SweepProgress(4, stream=out, clock=clock, tty=False)
    ts = [trial(str(i), 8, 8, 1, 0, 1e-3, status="TERMINATED" if i < 2 else "RUNNING") for i in range(4)]
    p.on_step_end(0, ts)
    clock.t += 60
    ts[2].status = "TERMINATED"
    p.on_step_end(0, ts)
    # 3 of 4 done, but 1 of them in this driver's 60 s: 1 left at 1 a minute
    assert out.getvalue().splitlines()[-1].endswith("3/4 done, 1 running, 0 pending  01:00 elapsed, ETA 01:00")


def test_terminal_bar_is_redrawn_in_place_under_event_lines():
    out, clock = io.StringIO(), Clock()
    p = SweepProgress(2, stream=out, clock=clock, tty=True)
    ts = [trial("a", 8, 8, 1, 0, 1e-3), trial("b", 16, 16, 1, 0, 1e-3)]
    p.setup()
    p.on_step_end(0, ts)
    clock.t += 0.1
    p.on_step_end(0, ts)  # within the redraw interval: nothing
    clock.t += 1
    p.on_step_end(0, ts)
    text = out.getvalue()
    assert text.count("\r[") == 2 and "\n" not in text  # one line, redrawn
    p.on_trial_result(0, ts, ts[0], {"status": M.STATUS_DIVERGED, M.STEP: 12, M.EVAL_LOSS: 9.5, "time_total_s": 3})
    after = out.getvalue()[len(text) :]
    # the bar is cleared, the event printed on its own line, the bar (now 1/2) drawn again below it
    cleared, event, redrawn = after.partition("[1/2] B=8 (8x1x1) lr=1e-3: diverged at step 12 (eval/loss 9.5), 3 s\n")
    assert event and cleared.startswith("\r") and not cleared.strip()
    assert redrawn.startswith("\r[############............] 1/2 done")
    p.on_experiment_end(ts)
    assert out.getvalue().splitlines()[-1].startswith("[bcrit] 2/2 trials finished")


def test_log_lines_keeps_one_line_per_refresh():
    out = io.StringIO()
    lines = LogLines(out)
    for s in ("\r[..] 0/2", "\r[#.] 1/2   ", "\r" + " " * 9 + "\r", "\n"):
        lines.write(s)
    assert out.getvalue() == "[bcrit] [..] 0/2\n[bcrit] [#.] 1/2\n"


def test_progress_pickles_without_its_stream():
    import pickle

    p = SweepProgress(2, stream=io.StringIO(), tty=True)
    q = pickle.loads(pickle.dumps(p))
    assert q.total == 2 and q._stream is None


def test_strip_rows_leaves_the_scalars():
    result = {"status": "running", M.STEP: 3, "rows": [[3, 12, M.EVAL_LOSS, 0.5, 0.1, 1.0]]}
    StripRows().on_trial_result(0, [], None, result)
    assert result == {"status": "running", M.STEP: 3}


def test_train_progress_file_and_bar(tmp_path):
    path = str(tmp_path / "progress.json")
    write_progress(path, {M.STEP: 30, M.EVAL_LOSS: 0.25, "train_seconds": 6.0, "rows": [[1] * 6], "status": "running"})
    p = json.load(open(path))
    assert "rows" not in p and p[M.STEP] == 30
    out, clock = io.StringIO(), Clock()
    bar = TrainProgress(path, max_steps=150, target=0.22, stream=out, tty=False, clock=clock)
    bar.show({M.STEP: 10})  # the first report starts the bar
    clock.t += 60
    bar.show(p)  # 20 steps a minute since: 120 steps left -> 6 minutes
    bar.__exit__(None, None, None)
    assert out.getvalue().splitlines() == [
        "[bcrit] [#.......................] step 10/150, eval/loss --"
        " (target 0.22)  00:00 since the first report, ETA <= ? (budget)",
        "[bcrit] [####....................] step 30/150, eval/loss 0.25"
        " (target 0.22)  01:00 since the first report, ETA <= 06:00 (budget)",
    ]


def test_verbose_switches_tunes_own_output_and_logs(monkeypatch):
    import logging

    from orchestrator.cli.main import build_parser
    from orchestrator.cluster.ray_logs import quiet_driver_logs

    monkeypatch.delenv("RAY_AIR_NEW_OUTPUT", raising=False)
    slow = logging.LogRecord("ray.tune.utils.util", logging.WARNING, "", 0, "x took 0.6 s, which may be a "
                             "performance bottleneck.", None, None)  # fmt: skip
    util = logging.getLogger("ray.tune.utils.util")
    try:
        quiet_driver_logs(False)  # the default: classic Tune output at verbosity 0 prints no boxes
        assert os.environ["RAY_AIR_NEW_OUTPUT"] == "0"
        assert logging.getLogger("ray.tune").level == logging.WARNING and not util.filter(slow)
        quiet_driver_logs(True)  # --verbose: Tune's new output, INFO logs, slow-callback warnings
        assert os.environ["RAY_AIR_NEW_OUTPUT"] == "1"
        assert logging.getLogger("ray.tune").level == logging.INFO and util.filter(slow)
    finally:
        quiet_driver_logs(False)
    parser = build_parser()
    assert parser.parse_args(["sweep", "s.yaml", "--verbose"]).verbose
    assert parser.parse_args(["train", "c.yaml", "--verbose"]).verbose
    assert not parser.parse_args(["sweep", "s.yaml"]).verbose


def test_global_gns_note_is_one_line_per_sweep():
    from orchestrator.cli.sweep_cmd import gns_note

    def dit(w: int, a: int, gns: bool = True, halves: bool = True, micro: int = 8) -> dict:
        return {"dataset": "digits", "num_workers": w, "grad_accum": a, "gns": gns, "gns_halves": halves,
                "micro_batch_size": micro}  # fmt: skip

    # W = A = 1 trials measure it from two half-batch backward passes (gns_halves, the default): no line at all
    assert gns_note([dit(0, 1), dit(2, 1), dit(0, 2), dit(1, 1)]) is None
    assert gns_note([dit(0, 1, halves=False), dit(2, 1), dit(0, 2), dit(1, 1, micro=1)]) == (
        "[bcrit] global GNS: unavailable for 2 of 4 trials (it needs num_workers x grad_accum >= 2, or gns_halves "
        "with micro_batch_size >= 2); their per-bin GNS is unaffected"
    )
    assert gns_note([dit(2, 1), dit(0, 1, gns=False, halves=False)]) is None  # all have it, or asked for none
    assert gns_note([{"dim": 10, "num_workers": 0, "grad_accum": 1}]) is None  # the quadratic workload has no GNS


def test_a_bar_opened_while_another_is_open_writes_no_cursor_moves():
    # tqdm stacks concurrent bars with cursor-up escapes; bcrit has one bar per process, and a bar an earlier
    # driver left open (a resume in the same process, the tests' drivers) must not make the log lines "\x1b[A"
    s = io.StringIO()
    first = make_bar(4, "{bar} {n}/{total}", stream=s, tty=False)
    second = make_bar(4, "{bar} {n}/{total}", stream=s, tty=False)
    second.update(1)
    second.refresh()
    second.close()
    first.close()
    assert "\x1b" not in s.getvalue() and "[bcrit] ##........ 1/4" in s.getvalue()
