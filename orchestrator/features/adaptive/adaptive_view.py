"""What an adaptive sweep waits for, shown as it runs: a progress line per refit and the MLflow parent run's
``adaptive/*`` metrics (and, with ``goal.bins``, the tag ``bcrit.adaptive_widest``), both read from the decisions
file the searcher writes (orchestrator.features.adaptive.adaptive_search's `DECISIONS_FILE`), so they hold after a
driver restart too."""

from __future__ import annotations

import json
import os

from ray.tune import Callback

from analysis.core import metrics as M
from analysis.features.adaptive.next_trials import flagged_text
from orchestrator.records.progress import fmt_lr
from orchestrator.storage.layout import DECISIONS_FILE

STOPS = {
    "goal_met": "goal met",
    "budget_trials": "trial budget spent",
    "budget_examples": "examples budget spent",
    "space_exhausted": "nothing left to try",
}


def read_decisions(sweep_dir: str) -> dict | None:
    """The decisions file of a sweep directory, or None (not an adaptive sweep, or no refit yet)."""
    try:
        with open(os.path.join(sweep_dir, DECISIONS_FILE), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def widest_global(refit: dict) -> float | None:
    """The relative half-width at the goal target where it is widest (None while a target has no fit)."""
    w = list(refit["widths"].values())
    return None if not w or any(x is None for x in w) else max(w)


def widest(refit: dict) -> float | None:
    """What the goal compares with ``rel_ci``: the widest of the global targets and (``goal.bins``) the counted
    bins (None while one of them has no fit)."""
    if "widest" not in refit:  # a decisions file written before per-bin goals
        return widest_global(refit)
    return refit["widest"]["width"] if widest_global(refit) is not None else None


def bin_widths(refit: dict) -> dict[int, float]:
    """Per counted (trusted) bin, its widest target's relative half-width (``goal.bins``; else empty)."""
    out: dict[int, float] = {}
    for b in refit.get("bins", []):
        if b["counted"]:
            out[b["bin"]] = max(out.get(b["bin"], 0.0), b["width"])
    return out


def _bins_text(refit: dict) -> str:
    """``; widest: bin t=750-999 at 0.3 +-23%; 2 of 20 bin intervals untrusted`` (``goal.bins``; else empty)."""
    bins = refit.get("bins", [])
    if not bins:
        return ""
    w = refit["widest"]
    out = f"; widest: {w['what']} " + (f"+-{w['width']:.0%}" if w["width"] is not None else "no fit yet")
    bad = sum(1 for b in bins if not b["counted"])
    return out + (f"; {bad} of {len(bins)} bin intervals untrusted" if bad else "")


def status_line(decisions: dict, refit: dict) -> str:
    """E.g. ``B_crit at 0.3: +-23% -> goal 15%; next: seed 2 at B=32 lr=1.2`` (one refit); with ``goal.bins``
    ``B_crit at 0.3: +-12%; widest: bin t=750-999 at 0.3 +-23% -> goal 15%; ...``. A stop names the goal targets
    whose answer the analysis flags (the goal checks widths, seeds and ``lr_at_edge`` only)."""
    widths = ", ".join(f"{t}: +-{w:.0%}" if w is not None else f"{t}: no fit yet" for t, w in refit["widths"].items())
    head = f"B_crit at {widths}{_bins_text(refit)} -> goal {decisions['goal']['rel_ci']:.0%}"
    if refit["stop"]:
        flagged = flagged_text(refit.get("flags", {}))
        ending = len(refit.get("ending") or [])
        ending = f"; ending {ending} running trial(s) (kept, not fitted)" if ending else ""
        return (
            f"{head}; stop: {STOPS.get(refit['stop'], refit['stop'])} after {refit['trials_finished']} "
            f"trials{ending}{flagged}"
        )
    if not refit["choices"]:
        why = ": expected to meet the goal" if refit.get("holding") else ""
        return f"{head}; waiting for {refit['trials_pending']} running trial(s){why}"
    seeds = decisions["seeds"]
    c = refit["choices"][0]
    what = f"seed {seeds[c['seed']]}" if c["kind"] == "seed" else c["kind"].replace("_", " ")
    more = f" (+{len(refit['choices']) - 1} more)" if len(refit["choices"]) > 1 else ""
    return f"{head}; next: {what} at B={c['batch_size']} lr={fmt_lr(c['lr'])}{more}"


class AdaptiveWatch(Callback):
    """Driver-side Tune callback: each new refit in the decisions file becomes a progress line and a point of
    the ``adaptive/*`` metrics on the sweep's MLflow parent run. Listed before the tracking callback, so the last
    refit is logged before the parent run ends."""

    def __init__(self, sweep_dir: str, tracking, progress):
        self.sweep_dir, self.tracking, self.progress = sweep_dir, tracking, progress
        self._shown = 0  # refits shown and logged
        self._mtime: float | None = None

    def _check(self, trials=()) -> None:
        path = os.path.join(self.sweep_dir, DECISIONS_FILE)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return
        if mtime == self._mtime:
            return
        self._mtime = mtime
        d = read_decisions(self.sweep_dir)
        if d is None:
            return
        if self._shown > len(d["refits"]):  # a restored searcher state older than this driver's view
            self._shown = len(d["refits"])
        for refit in d["refits"][self._shown :]:
            self.progress.line(status_line(d, refit), trials)
            if self.tracking.parent_id is not None:
                self._log(refit)
        self._shown = len(d["refits"])

    def _log(self, refit: dict) -> None:
        """One refit's points: ``adaptive/rel_ci`` (what the goal compares); with ``goal.bins`` also
        ``adaptive/rel_ci_global``, ``adaptive/bin{k}/rel_ci`` per counted bin and the tag naming the widest."""
        step, run, client = int(refit["trials_finished"]), self.tracking.parent_id, self.tracking.client
        w = widest(refit)
        if w is None:
            return
        client.log_metric(run, M.ADAPTIVE_REL_CI, w, step=step)
        if not refit.get("bins"):
            return
        client.log_metric(run, M.ADAPTIVE_REL_CI_GLOBAL, widest_global(refit), step=step)
        for k, bw in bin_widths(refit).items():
            client.log_metric(run, M.per_bin(M.ADAPTIVE_BIN_REL_CI, k), bw, step=step)
        client.set_tag(run, "bcrit.adaptive_widest", refit["widest"]["what"])

    def setup(self, **info) -> None:
        d = read_decisions(self.sweep_dir)  # a resumed sweep: what the killed driver showed is not shown again
        self._shown = len(d["refits"]) if d else 0

    def on_step_end(self, iteration, trials, **info) -> None:
        self._check(trials)

    def on_experiment_end(self, trials, **info) -> None:
        self._check(trials)
        d = read_decisions(self.sweep_dir)
        if d is not None and d.get("stop") and self.tracking.parent_id is not None:
            self.tracking.client.set_tag(self.tracking.parent_id, "bcrit.adaptive_stop", d["stop"])
