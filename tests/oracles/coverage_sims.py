"""Coverage of the B_crit interval at the trusted (unflagged) targets, on two independent simulators (test and
benchmark helper, not a test module).

``old``: ``synth_runs`` (``COVERAGE_SWEEP``: 3 seeds, 10% scatter, global stop at 0.2) with two timestep bins of true
B_crit 128 and 1024; its global targets are ``COVERAGE_TARGETS`` as in the coverage figure of issue 12. ``new``:
``synth_sweeps`` (correlated noise along loss curves, interpolated crossings, seed-to-seed lr optimum, B_crit that
moves along training, four bins); its targets are spread automatically, as ``bcrit analyze`` does. Per-bin targets
are automatic on both, as in :func:`analysis.reporting.report.analyze`.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from analysis.core import metrics as m
from analysis.fits import flags as fl
from analysis.fits.sweep_fit import analyze_metric
from tests.oracles.synth_runs import map_draws

OLD_BIN_E_MIN = (200.0 * 128, 200.0 * 1024)  # synth_runs bins: true B_crit = bin_e_min / s_min (s_min = 200)


def _old_sweep(rng: np.random.Generator, **kw):
    from tests.oracles.synth_runs import COVERAGE_SWEEP, COVERAGE_TARGETS, synth_runs

    runs = synth_runs(rng, **{**COVERAGE_SWEEP, **kw}, bins=2, bin_e_min=OLD_BIN_E_MIN)
    truths = {m.EVAL_LOSS: lambda y: 256.0}
    for k, e in enumerate(OLD_BIN_E_MIN):
        truths[m.per_bin(m.EVAL_LOSS_BIN, k)] = lambda y, e=e: e / 200.0
    return runs, truths, {m.EVAL_LOSS: list(COVERAGE_TARGETS)}


def _new_sweep(rng: np.random.Generator, **kw):
    from tests.oracles.synth_sweeps import Sweep, simulate, truth

    sw = Sweep(**kw)
    runs = simulate(rng, sw)
    names = [m.EVAL_LOSS] + [m.per_bin(m.EVAL_LOSS_BIN, k) for k in range(len(sw.bins))]
    return runs, {nm: (lambda y, nm=nm: truth(sw, nm, y)) for nm in names}, {}


def _shape_sweep(name: str):
    from tests.oracles.synth_shapes import SHAPES

    def draw(rng: np.random.Generator, **kw):
        return _new_sweep(rng, **{**SHAPES[name].__dict__, **kw})

    return draw


def _simulators() -> dict:
    from tests.oracles.synth_shapes import SHAPES

    return {"old": _old_sweep, "new": _new_sweep, **{f"shape:{k}": _shape_sweep(k) for k in SHAPES}}


SIMULATORS = _simulators()


def coverage_records(
    sim: str,
    draws: int,
    bootstrap: int,
    first_seed: int = 500,
    level: float = 0.9,
    calibrate: bool = True,
    processes: int = 1,
    **kw,
) -> dict:
    """Analyse ``draws`` sweeps of simulator ``sim`` (``old``, ``new`` or ``shape:NAME`` of ``synth_shapes``) over
    ``processes`` processes (the same numbers with any); arrays over every analysed (sweep, metric, target):
    ``truth``, ``b_crit``, ``lo``, ``hi``, ``trusted`` (no flags), ``at_divergence_only`` (flagged
    ``lr_at_divergence`` and nothing else: trusted but for that flag), ``is_bin``, ``draw``, ``ci_level``,
    ``b_crit_refined``. ``calibrate``: as ``analyze_metric``'s. ``kw``: the simulator's options."""
    one = partial(_records_of_draw, sim=sim, bootstrap=bootstrap, first_seed=first_seed, level=level,
                  calibrate=calibrate, kw=kw)  # fmt: skip
    rows = [r for rs in map_draws(one, range(draws), processes) for r in rs]
    return {k: np.asarray([r[k] for r in rows]) for k in RECORD_KEYS}


RECORD_KEYS = ("truth", "b_crit", "lo", "hi", "trusted", "at_divergence_only", "is_bin", "draw", "ci_level",
               "b_crit_refined")  # fmt: skip


def _records_of_draw(d: int, sim: str, bootstrap: int, first_seed: int, level: float, calibrate: bool,
                     kw: dict) -> list[dict]:  # fmt: skip
    """Sweep ``d`` of :func:`coverage_records`: one record (``RECORD_KEYS``) per analysed (metric, target)."""
    runs, truths, targets = SIMULATORS[sim](np.random.default_rng(first_seed + d), **kw)
    out = []
    for name, tr in truths.items():
        res = analyze_metric(runs, name, targets.get(name), bootstrap=bootstrap, seed=d, level=level,
                             strict=False, notes=[], calibrate=calibrate)  # fmt: skip
        for r in res:
            lo, hi = r["b_crit_ci"]
            out.append({
                "truth": tr(r["target"]), "b_crit": r["b_crit"],
                "lo": np.nan if lo is None else lo, "hi": np.nan if hi is None else hi,
                "trusted": not r["flags"], "at_divergence_only": r["flags"] == [fl.LR_AT_DIVERGENCE],
                "is_bin": name != m.EVAL_LOSS, "draw": d, "ci_level": r["ci_level"],
                "b_crit_refined": r["b_crit_refined"],
            })  # fmt: skip
    return out


def summary(rec: dict, which: np.ndarray) -> dict:
    """Coverage (and its binomial SE), misses below/above, median relative width ``hi/lo - 1``, median |error|
    and the median level the intervals were taken at, over ``which``."""
    t, est, lo, hi = (rec[k][which] for k in ("truth", "b_crit", "lo", "hi"))
    return {
        "n": int(which.sum()),
        "coverage": float(np.mean((lo <= t) & (t <= hi))) if len(t) else float("nan"),
        "se": float(np.sqrt(np.mean((lo <= t) & (t <= hi)) * (1 - np.mean((lo <= t) & (t <= hi))) / len(t)))
        if len(t)
        else float("nan"),
        "level": float(np.median(rec["ci_level"][which])) if len(t) else float("nan"),
        "truth_below": float(np.mean(t < lo)) if len(t) else float("nan"),
        "truth_above": float(np.mean(t > hi)) if len(t) else float("nan"),
        "width": float(np.median(hi / lo - 1)) if len(t) else float("nan"),
        "error": float(np.median(np.abs(est / t - 1))) if len(t) else float("nan"),
    }
