"""Per-timestep-bin goals of the adaptive sweep (``Goal.bins``; docs/sweeps.md "Adaptive search").

At each refit, for every goal target with a global fit, every timestep bin is fitted exactly as ``bcrit analyze``
answers "does B_crit differ across timesteps" (:mod:`analysis.fits.answer`): the bin's matched target is its own
eval loss where the global target's fitted trials cross the goal target
(:func:`analysis.fits.answer.matched_bin_target`), and the bin is analysed there by
:func:`analysis.fits.sweep_fit.analyze_metric` (bootstrap and calibration as the global refit). A bin **counts**
towards the goal when the analysis trusts it (:func:`analysis.fits.answer.trusted_bins`'s rule: a fit, no flags,
a finite interval); a bin without a fit or with flags is kept with its flags and reported as untrusted, never
counted silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.core import metrics as m
from analysis.core.bins import timestep_bins
from analysis.fits import gns_view, pareto
from analysis.fits.answer import matched_bin_target
from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import Runs

NO_FIT = "no_fit"  # the flag of a bin whose matched target too few batch sizes reach (or no matched target)
NUM_TIMESTEPS = 1000  # the timesteps the bins partition (bcrit analyze's default)


@dataclass(frozen=True)
class BinInterval:
    """One timestep bin's B_crit interval at one goal target."""

    bin: int
    timesteps: tuple[int, int]
    target: float  # the goal target (a global eval loss): the point of training the bin is read at
    bin_target: float | None  # the bin's own eval loss there (None: no matched target)
    width: float  # relative half-width (hi - lo) / (2 B_crit); inf without a fit or an interval
    flags: tuple[str, ...]  # the analysis's flags (NO_FIT without a fit); empty = trusted
    fit: dict | None  # analyze_metric's entry

    @property
    def counted(self) -> bool:
        """Whether the goal looks at this bin: the analysis trusts it."""
        return not self.flags and bool(np.isfinite(self.width))

    @property
    def metric(self) -> str:
        return m.per_bin(m.EVAL_LOSS_BIN, self.bin)

    def label(self) -> str:
        return f"bin t={self.timesteps[0]}-{self.timesteps[1]} at {self.target:g}"

    def record(self) -> dict:
        """As data (the adaptive decisions file)."""
        return {
            "bin": self.bin,
            "timesteps": list(self.timesteps),
            "target": self.target,
            "bin_target": None if self.bin_target is None else float(self.bin_target),
            "width": float(self.width) if np.isfinite(self.width) else None,
            "flags": list(self.flags),
            "counted": self.counted,
            "b_crit": None if self.fit is None else float(self.fit["b_crit"]),
        }


def rel_width(fit: dict) -> float:
    """``(hi - lo) / (2 B_crit)`` of an analyze_metric entry (inf without an interval)."""
    lo, hi = fit["b_crit_ci"]
    if lo is None or hi is None:
        return np.inf
    return (hi - lo) / (2 * fit["b_crit"])


def bin_intervals(
    runs: Runs, fits: list[dict], metric: str, bootstrap: int, seed: int, level: float
) -> list[BinInterval]:
    """Every timestep bin reported in ``runs`` at every goal target with a global fit (``fits``): its interval and
    whether it is trusted. Costs one :func:`analyze_metric` call per (bin, target)."""
    ks = gns_view.bins_in(runs, metric + "/")
    if not ks:
        return []
    ranges = timestep_bins(max(ks) + 1, NUM_TIMESTEPS)
    out = []
    for f in fits:
        for k in ks:
            y = matched_bin_target(runs, metric, f, k)
            entry = None
            if y is not None:
                try:
                    got = analyze_metric(runs, m.per_bin(m.EVAL_LOSS_BIN, k), [y], bootstrap, seed, level,
                                         strict=False, notes=[])  # fmt: skip
                except pareto.TooFewBatchSizesError:
                    got = []
                entry = got[0] if got else None
            flags = (NO_FIT,) if entry is None else tuple(entry["flags"])
            width = np.inf if entry is None else rel_width(entry)
            out.append(BinInterval(k, tuple(ranges[k]), float(f["target"]), y, width, flags, entry))
    return out


def untrusted_text(bins: list[BinInterval]) -> str:
    """E.g. ``t=0-99 at 0.3 (near_floor), t=900-999 at 0.3 (no_fit)``: the bins the goal does not count, and why
    (an interval without flags but without a finite width: ``no interval``)."""
    bad = [b for b in bins if not b.counted]
    return ", ".join(f"t={b.timesteps[0]}-{b.timesteps[1]} at {b.target:g} "
                     f"({', '.join(b.flags) or 'no interval'})" for b in bad)  # fmt: skip
