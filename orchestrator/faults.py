"""Fault injection for the kill tests: ``BCRIT_FAULT=<point>`` SIGKILLs the driver's whole process group (the
driver, its local Ray, every worker -- what ``kill -9 -PGID`` does) when the sweep reaches ``<point>``. Used only
where a real kill cannot be timed: right after the MLflow parent run is created, before Tune's first
experiment-state file (Tune callbacks set up), and between Ray Train persisting a checkpoint and the driver
writing that report's rows. Unset (always, outside tests) it does nothing."""

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
    if point not in ("tune_setup", "result_unrecorded"):
        return []
    from ray.tune import Callback

    class Fault(Callback):
        def setup(self, **info) -> None:
            fault_point("tune_setup")  # tuner.pkl written, Tune's first experiment-state file not yet

        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            # the first result at or past BCRIT_FAULT_STEP (a multiple of checkpoint_every): Train persisted its
            # checkpoint before reporting, the tables have not written its rows yet
            if result.get("step", 0) >= int(os.environ.get("BCRIT_FAULT_STEP", "20")):
                fault_point("result_unrecorded")

    return [Fault()]
