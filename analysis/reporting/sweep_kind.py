"""Which analysis a sweep's runs get, decided from the runs alone: a branched study (``bcrit branch``) its branched
report (analysis.features.branched.branch_report); any other sweep the S(B) fit (analysis.reporting.report) on its
trials at
one batch size throughout (a trial with a ``batch_schedule`` has no single B), of the uniform timestep sampler when
it compared samplers (the others then in its report's comparison, analysis.features.allocation.allocation_view).
Whether the metric can support that fit is checked here too, before any compute (`check_sweep`, `check_metric`: the
same checks guard ``bcrit recommend``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.core.bcrit_error import BcritError
from analysis.fits.pareto import MIN_BATCH_SIZES
from analysis.fits.steps import usable
from analysis.sources.loaders import UNIFORM, Runs, is_branched, samplers_of, subset

BRANCHED = "branched"  # the branched report
SWEEP = "sweep"  # the S(B) fit


class KindError(BcritError):
    """Runs that no analysis takes as they are, or a metric or target it cannot use (one line: why, what to do)."""


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


def check_metric(
    runs: Runs, metric: str, targets: list[float] | None, flag: str = "--targets", default: str = "automatic ones"
) -> None:
    """Clear messages (KindError) for data the fit cannot use: every value non-finite, too few batch sizes with a
    finite value, or a target at or above every trial's starting value (every trial meets it before training).
    ``flag`` names the option that gave the targets; ``default``, what omitting it gives."""
    s = runs.series(metric)
    if len(s.value) == 0:
        return  # analysis.reporting.report names the metrics that exist
    finite = np.isfinite(s.value)
    if not finite.any():
        raise KindError(
            f"every {metric} value is NaN or infinite ({len(s.value)} values of {len(runs.trial_ids)} trials): "
            "the trials diverged from the start or the metric was never computed; nothing to analyse"
        )
    ok = usable(runs)
    keep = finite & ok[s.trial]
    have = np.unique(runs.batch_size[np.unique(s.trial[keep])])
    if len(have) < MIN_BATCH_SIZES:
        none = sorted(set(np.unique(runs.batch_size).tolist()) - set(have.tolist()))
        missing = f"; {none} have none" if none else ""
        raise KindError(
            f"only batch sizes {have.tolist()} have a finite {metric} in a usable (not diverged or failed) trial"
            f"{missing} (need >= {MIN_BATCH_SIZES} batch sizes)"
        )
    if targets:
        t, v = s.trial[keep], s.value[keep]
        first = np.ones(len(t), dtype=bool)
        first[1:] = t[1:] != t[:-1]
        top = float(v[first].max())
        above = [x for x in targets if x >= top]
        if above:
            raise KindError(
                f"{flag} {','.join(f'{x:g}' for x in above)}: at or above every trial's starting {metric} "
                f"(the highest start is {top:.4g}), so every trial meets it before training; choose targets below "
                f"{top:.4g}, or omit {flag} for {default}"
            )


def check_sweep(kind: SweepKind, metric: str, targets: list[float] | None) -> None:
    """`check_metric` on the runs the S(B) fit of ``kind`` takes (a branched study's analysis checks its own)."""
    if kind.kind == BRANCHED:
        return
    try:
        check_metric(kind.runs, metric, targets)
    except KindError as e:
        if not kind.compares_samplers or "batch sizes" not in str(e):
            raise
        hint = "this sweep compares timestep samplers: `bcrit allocate SWEEP_DIR` measures it"
        raise KindError(f"{e}; {hint}") from None
