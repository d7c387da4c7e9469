"""Which analysis a sweep's runs get, decided from the runs alone: a branched study (``bcrit branch``) its branched
report (analysis.features.branched.branch_report); any other sweep the S(B) fit (analysis.reporting.report) on its
trials at
one batch size throughout (a trial with a ``batch_schedule`` has no single B), of the uniform timestep sampler when
it compared samplers (the others then in its report's comparison, analysis.features.allocation.allocation_view)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.sources.loaders import UNIFORM, Runs, is_branched, samplers_of, subset

BRANCHED = "branched"  # the branched report
SWEEP = "sweep"  # the S(B) fit


class KindError(ValueError):
    """Runs that no analysis takes as they are (one line saying why and what to do)."""


@dataclass(frozen=True)
class SweepKind:
    """The analysis of a sweep: ``kind`` (`BRANCHED` or `SWEEP`), ``runs`` (what it fits), ``all_runs`` (with the
    other samplers' trials, for the comparison; ``runs`` itself otherwise), ``notes`` (what was left out, a line
    each, for the terminal)."""

    kind: str
    runs: Runs
    all_runs: Runs
    notes: tuple[str, ...] = ()

    @property
    def compares_samplers(self) -> bool:
        return self.runs is not self.all_runs


def sweep_kind(runs: Runs) -> SweepKind:
    """The analysis ``runs`` get (module docstring); KindError when every trial follows a batch schedule, or a
    comparison of samplers has no uniform one."""
    if is_branched(runs):
        return SweepKind(BRANCHED, runs, runs)
    notes = []
    scheduled = _scheduled(runs)
    if scheduled.all() and len(scheduled):
        raise KindError(
            "every trial follows a batch_schedule, so no batch size is constant for S(B); compare schedules as "
            "docs/schedule.md describes and fit B_crit on constant-batch trials"
        )
    if scheduled.any():
        notes.append(f"{int(scheduled.sum())} trial(s) with a batch_schedule left out of the S(B) fit (no one batch "
                     "size); docs/schedule.md compares them")  # fmt: skip
        runs = subset(runs, ~scheduled)
    kinds = samplers_of(runs)
    if len(set(kinds)) < 2:
        return SweepKind(SWEEP, runs, runs, tuple(notes))
    if not (kinds == UNIFORM).any():
        raise KindError(f"the sweep compared samplers {sorted(set(kinds))} without uniform; analyse it per sampler")
    notes.append(f"samplers {sorted(set(kinds))}: B_crit from the uniform trials, the comparison appended to the "
                 "report (bcrit allocate for more)")  # fmt: skip
    return SweepKind(SWEEP, subset(runs, kinds == UNIFORM), runs, tuple(notes))


def _scheduled(runs: Runs) -> np.ndarray:
    """Per trial: whether it follows a ``batch_schedule`` (analysis.core.stages)."""
    if "batch_schedule" not in runs.trials.column_names:
        return np.zeros(runs.trials.num_rows, dtype=bool)
    col = pc.cast(runs.trials.column("batch_schedule"), pa.string()).to_pylist()
    return np.array([v not in (None, "", "null", "[]", "None") for v in col], dtype=bool)
