"""Hand a Ray Train run's last results to Tune before the function trainable returns (a Ray 2.60 deadlock).

With Ray Train V2 inside a Tune function trainable, `TuneReportCallback` puts each report into the Tune session's
*inter-actor queue*, and Tune's main thread moves each item into the session's ``result_queue`` (size 1) in
`_TrainSession.get_next` (``ray/train/_internal/session.py``). When the function returns, Tune's wrapper reports
``{RESULT_DUPLICATE: True}`` into that same ``result_queue`` (``ray/tune/trainable/function_trainable.py``); a final
report still in the inter-actor queue then makes the main thread block forever on the full queue and the trial hang
(docs/design.md). `hand_off_pending_results` runs in the training thread after ``TorchTrainer.fit()`` returns: it
reports every item still in the inter-actor queue itself (the normal report path, which waits until Tune has taken
the result), then waits until both queues have stayed empty for a moment, so the wrapper's duplicate never races one
of ours."""

from __future__ import annotations

import time

SETTLE_S = 1.0  # both queues empty this long: the main thread is not between taking an item and queueing it
TIMEOUT_S = 120.0


def hand_off_pending_results(session=None, settle_s: float = SETTLE_S, timeout_s: float = TIMEOUT_S) -> int:
    """Report the results Tune has not taken yet from this (training) thread; returns how many it reported.
    ``session``: the Tune/Train ``_TrainSession`` (default: the current one)."""
    if session is None:
        # Ray: deferred, importing tune_handoff loads no Ray
        from ray.train._internal.session import get_session

        session = get_session()
    inter = getattr(session, "_inter_actor_queue", None)
    if session is None or inter is None:  # no Train run reported through this session
        return 0
    # Ray: deferred, importing tune_handoff loads no Ray
    from ray.util.queue import Empty

    reported = 0
    deadline = time.monotonic() + timeout_s
    quiet_since = None
    while time.monotonic() < deadline:
        try:
            item = inter.get(block=False)
        except Empty:
            item = None
        if item:
            session.report(item)  # blocks until Tune's main thread has taken it
            reported += 1
            quiet_since = None
            continue
        if inter.empty() and session.result_queue.empty():
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= settle_s:
                break
        else:
            quiet_since = None
        time.sleep(0.02)
    return reported
