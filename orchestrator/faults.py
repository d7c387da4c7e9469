"""Fault injection for the kill tests: ``BCRIT_FAULT=<point>`` SIGKILLs the driver's whole process group (the
driver, its local Ray, every worker -- what ``kill -9 -PGID`` does) when the sweep reaches ``<point>``. Used only
where a real kill cannot be timed: right after the MLflow parent run is created, before Tune's first
experiment-state file, and between Ray Train persisting a checkpoint and the driver writing that report's rows.
Unset (always, outside tests) it does nothing."""

from __future__ import annotations

import os
import signal

ENV = "BCRIT_FAULT"


def fault_point(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.killpg(os.getpgid(0), signal.SIGKILL)


def fault_callbacks() -> list:
    """Tune callbacks for the points inside Tune (empty unless ``BCRIT_FAULT`` names one); they go first, so a
    kill happens before bcrit's own callbacks see the event."""
    point = os.environ.get(ENV, "")
    if point not in ("first_trial_started", "result_unrecorded"):
        return []
    from ray.tune import Callback

    class Fault(Callback):
        def on_trial_start(self, iteration, trials, trial, **info) -> None:
            fault_point("first_trial_started")  # before Tune's first experiment-state file

        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            # a result whose checkpoint Train already persisted, its rows not yet written by the tables
            if result.get("status") != "running" or result.get("step", 0) >= int(
                os.environ.get("BCRIT_FAULT_STEP", 20)
            ):
                fault_point("result_unrecorded")

    return [Fault()]
