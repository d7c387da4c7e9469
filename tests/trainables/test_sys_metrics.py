"""`sys/examples_per_s` and `sys/peak_mem_gb` in a local trial's rows (trainables.sys_metrics)."""

import resource

import pytest

from analysis.core import metrics as M
from trainables import timing
from trainables.config import TrialConfig
from trainables.sys_metrics import GIB, SysMetrics, peak_mem_gb
from trainables.trial import run_local

TINY = dict(preset="tiny", batch_size=16, micro_batch_size=8, eval_every=2, eval_repeats=1, gns_every=0, max_steps=7)


def sys_rows(session, name):
    return [(r[0], r[3], r[4]) for rep in session.reports for r in rep["rows"] if r[2] == name]


class GrowingClock:
    """A fake step clock whose steps take longer and longer (so an interval's rate differs from the running mean);
    keeps every value it returned."""

    def __init__(self):
        self.calls: list[float] = []

    def __call__(self) -> float:
        k = len(self.calls)
        self.calls.append(0.001 * k * k)
        return self.calls[-1]


def test_examples_per_s_is_the_report_intervals_rate(monkeypatch):
    clock = GrowingClock()
    monkeypatch.setattr(timing, "CLOCK", clock)
    s = run_local(TrialConfig(**TINY))
    got = sys_rows(s, M.SYS_EXAMPLES_PER_S)
    assert [step for step, _, _ in got] == [2, 4, 6, 7]  # every report after training, the last one partial
    # independently: each step's seconds from the clock's start/stop pairs (the step timer's only reads on CPU)
    assert len(clock.calls) == 2 * 7
    step_s = [clock.calls[2 * i + 1] - clock.calls[2 * i] for i in range(7)]
    prev = 0
    for step, value, wall in got:
        assert value == pytest.approx(16 * (step - prev) / sum(step_s[prev:step]), rel=1e-12)
        assert wall == pytest.approx(sum(step_s[:step]), rel=1e-12)  # stamped with train_seconds after the interval
        prev = step
    # the same from what the reports say: examples and train_seconds deltas between consecutive reports
    reps = [r for r in s.reports if r[M.STEP] > 0]
    starts = [(0, 0.0)] + [(r[M.EXAMPLES], r["train_seconds"]) for r in reps[:-1]]
    for (e0, t0), r, (_, value, _) in zip(starts, reps, got, strict=True):
        assert value == pytest.approx((r[M.EXAMPLES] - e0) / (r["train_seconds"] - t0), rel=1e-12)
    assert s.summary["last"][M.SYS_EXAMPLES_PER_S] == got[-1][1]


def test_peak_mem_is_this_process_peak_rss():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    s = run_local(TrialConfig(**TINY))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    peaks = [v for _, v, _ in sys_rows(s, M.SYS_PEAK_MEM_GB)]
    assert len(peaks) == 4 and peaks == sorted(peaks)  # one per report interval, non-decreasing
    assert 0 < before <= peaks[0] and peaks[-1] <= after  # GiB of this process (a torch process: > 0.1 GiB)
    assert before > 0.1
    rates = [v for _, v, _ in sys_rows(s, M.SYS_EXAMPLES_PER_S)]
    assert all(r > 0 for r in rates)  # the real clock


def test_interval_starts_at_the_restored_counters():
    m = SysMetrics("cpu", 32, step=10, train_seconds=5.0)  # a trial resumed at step 10 after 5 s of training
    assert m.interval(10, 5.0) == {}  # nothing trained since: nothing to say
    got = m.interval(12, 6.0)
    assert got[M.SYS_EXAMPLES_PER_S] == 64.0
    assert got[M.SYS_PEAK_MEM_GB] == peak_mem_gb("cpu") > 0
    assert m.interval(15, 9.0)[M.SYS_EXAMPLES_PER_S] == 32.0  # 3 x 32 / 3 s: from the previous report on
