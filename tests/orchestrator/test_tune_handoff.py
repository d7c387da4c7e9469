"""orchestrator.execution.tune_handoff: the Train run's results still in the inter-actor queue when ``fit()``
returns are
reported by the training thread itself, before Tune's wrapper adds its duplicate result (the Ray 2.60 deadlock)."""

from __future__ import annotations

import queue
import threading

from ray.util.queue import Empty

from orchestrator.execution.tune_handoff import hand_off_pending_results


class FakeInterActorQueue:
    """The interface of ``ray.util.queue.Queue`` that the hand-off uses, without an actor."""

    def __init__(self, items):
        self.items = list(items)

    def get(self, block=True, timeout=None):
        if not self.items:
            raise Empty
        return self.items.pop(0)

    def empty(self):
        return not self.items


class FakeSession:
    """A Tune session whose main thread takes each reported result after a delay, like Tune's controller."""

    def __init__(self, items, delay_s=0.05):
        self._inter_actor_queue = FakeInterActorQueue(items)
        self.result_queue = queue.Queue(1)
        self.taken: list = []
        self._stop = threading.Event()
        self._main = threading.Thread(target=self._consume, args=(delay_s,), daemon=True)
        self._main.start()

    def _consume(self, delay_s):
        while not self._stop.is_set():
            try:
                item = self.result_queue.get(timeout=0.01)
            except queue.Empty:
                continue
            self._stop.wait(delay_s)
            self.taken.append(item)

    def report(self, metrics, checkpoint=None):  # the training thread's report: put, wait until taken
        n = len(self.taken)
        self.result_queue.put(metrics)
        while len(self.taken) == n:
            self._stop.wait(0.005)

    def close(self):
        self._stop.set()
        self._main.join()


def test_pending_results_are_reported_in_order_before_returning():
    s = FakeSession([{"step": 1}, {"step": 2, "status": "diverged"}])
    try:
        assert hand_off_pending_results(s, settle_s=0.1) == 2
        assert s.taken == [{"step": 1}, {"step": 2, "status": "diverged"}]  # Tune has both, in order
        assert s._inter_actor_queue.empty() and s.result_queue.empty()  # the wrapper's duplicate cannot race
    finally:
        s.close()


def test_nothing_pending_returns_after_the_settle_time():
    s = FakeSession([])
    try:
        assert hand_off_pending_results(s, settle_s=0.05) == 0 and s.taken == []
    finally:
        s.close()


def test_a_session_without_a_train_run_is_left_alone():
    class NoTrain:
        _inter_actor_queue = None

    assert hand_off_pending_results(NoTrain()) == 0
