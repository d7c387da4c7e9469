"""The refined B_crit against the plain one, with its own bootstrap: coverage and the side of the misses, by sweep.

Issue 45: on ``t3`` and ``new`` the trusted targets' 90% intervals miss the known B_crit on one side (benchmarks/
RESULTS.md: the lean is a selection by how far each batch size's best *grid* lr sits from its optimum). The refined
estimate (``analysis.fits.lr_grid.refined_optima``: the optimum interpolated with the shared lr curvature) does not
share that lean. Three intervals on the same sweeps, at the trusted targets, globally and per bin: the plain one
(calibrated, as ``bcrit analyze`` gives it); the same multiplied by ``b_crit_refined / b_crit`` (a diagnostic: its
width unchanged, its centre the refined estimate); and the refined estimate's own interval
(``b_crit_refined_ci``: the refinement redone in every replicate, analysis.fits.refined_boot). Per row: coverage;
misses below / above the truth counted by target and by sweep (the targets of one sweep share its grid position and
seeds, so its misses fall on one side together: the sweeps are the independent units, and ``p`` is the binomial
test of an even split over them); the mean signed error in log with its SE by sweep; the median absolute error.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_refined_centre.py --sims shape:t3 new --draws 60 --first-seed 1200
    PYTHONPATH=. .venv/bin/python benchmarks/bench_refined_centre.py --sims old --draws 30 --no-refined-interval
    PYTHONPATH=. .venv/bin/python benchmarks/bench_refined_centre.py --sims new --draws 30 --sim-set lr_jitter=0 \
        --processes 2

``--sim-set KEY=VALUE`` sets a simulator option (``synth_sweeps.Sweep``'s fields, numbers only); ``--processes``
analyses the sweeps side by side (the same numbers). After each scope: the *spread ratio* of each estimate, the sd of
its log error over the sweeps' trusted targets divided by the mean half-width of its interval in log over the normal
quantile of the level (``log(hi/lo) / (2 z)``): 1 when the interval is as wide as the estimate's error says it should
be, below 1 when it is too narrow.
"""

from __future__ import annotations

import argparse
import sys
import time
from statistics import NormalDist

import numpy as np

sys.path.insert(0, "tests/analysis")
from tests.oracles.coverage_sims import coverage_records, misses_by_sweep, signed_error_by_sweep  # noqa: E402

Z90 = NormalDist().inv_cdf(0.95)  # a 90% interval's half-width over its sd (the analysis's default level)


def records(sim: str, draws: int, first_seed: int, bootstrap: int, refined_interval: bool = True, processes: int = 1,
            **kw) -> dict:  # fmt: skip
    """``coverage_records``' arrays at the trusted targets with a finite interval and refined estimate."""
    rec = coverage_records(sim, draws, bootstrap, first_seed, refined_interval=refined_interval, processes=processes,
                           **kw)  # fmt: skip
    keep = rec["trusted"] & np.isfinite(rec["lo"]) & np.isfinite(rec["hi"]) & np.isfinite(rec["b_crit_refined"])
    return {k: v[keep] for k, v in rec.items()}


def line(label: str, draw, t, est, lo, hi) -> str:
    """One row: coverage; misses below / above by target and by sweep (the sweeps that miss on each side, and the
    binomial test of an even split over them); the mean signed error with the sweeps as clusters; median |error|."""
    hit = (lo <= t) & (t <= hi)
    by = misses_by_sweep(draw, t, lo, hi)
    mean, se = signed_error_by_sweep(draw, np.log(est / t))
    return (
        f"| {label} | {len(t)} | {hit.mean():.3f} | {int((t < lo).sum())} / {int((t > hi).sum())} | "
        f"{by['below']} / {by['above']} of {by['sweeps']} (p {by['p_even']:.2f}) | {mean:+.4f} ± {se:.4f} | "
        f"{np.median(np.abs(est / t - 1)):.3f} |"
    )


def spread_ratio(t, est, lo, hi) -> float:
    """sd of ``log(est / t)`` over the mean ``log(hi / lo) / (2 z)``: 1 when the interval's width matches the error."""
    return float(np.std(np.log(est / t), ddof=1) / np.mean(np.log(hi / lo) / (2 * Z90)))


def sim_options(pairs: list[str]) -> dict:
    """``["lr_jitter=0", ...]`` -> ``{"lr_jitter": 0.0, ...}``."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--sim-set takes KEY=VALUE, got {pair!r}")
        out[key] = float(value)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sims", nargs="+", default=["shape:t3", "new"])
    p.add_argument("--draws", type=int, default=40)
    p.add_argument("--first-seed", type=int, default=700)
    p.add_argument("--bootstrap", type=int, default=400)
    p.add_argument("--refined-interval", action=argparse.BooleanOptionalAction, default=True,
                   help="the refined estimate's own interval too (doubles the time)")  # fmt: skip
    p.add_argument("--save", default="", help="write each simulator's trusted records to SAVE.<sim>.npz")
    p.add_argument("--sim-set", nargs="*", default=[], metavar="KEY=VALUE", help="simulator options (numbers)")
    p.add_argument("--processes", type=int, default=1, help="analyse the sweeps in this many processes")
    a = p.parse_args()
    kw = sim_options(a.sim_set)
    print(f"{a.draws} sweeps per simulator from seed {a.first_seed}, bootstrap {a.bootstrap}, calibrated; trusted only")
    print("| simulator, scope, interval | trusted targets | coverage | truth below / above | sweeps missing below / "
          "above | mean signed error (log) ± SE by sweep | median abs. error |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for sim in a.sims:
        t0 = time.perf_counter()
        r = records(sim, a.draws, a.first_seed, a.bootstrap, a.refined_interval, a.processes, **kw)
        if a.save:
            np.savez(f"{a.save}.{sim.replace(':', '_')}.npz", **r)
        for scope, w in (("global", ~r["is_bin"]), ("bins", r["is_bin"])):
            t, lo, hi, est, ref = r["truth"][w], r["lo"][w], r["hi"][w], r["b_crit"][w], r["b_crit_refined"][w]
            d = r["draw"][w]
            print(line(f"{sim}, {scope}, plain", d, t, est, lo, hi))
            print(line(f"{sim}, {scope}, re-centred on refined", d, t, ref, lo * ref / est, hi * ref / est))
            ratios = f"spread ratio: plain {spread_ratio(t, est, lo, hi):.2f}"
            if a.refined_interval:
                ok = np.isfinite(r["lo_ref"][w]) & np.isfinite(r["hi_ref"][w])
                print(line(f"{sim}, {scope}, refined, own bootstrap", d[ok], t[ok], ref[ok], r["lo_ref"][w][ok],
                           r["hi_ref"][w][ok]))  # fmt: skip
                ratios += f", refined {spread_ratio(t[ok], ref[ok], r['lo_ref'][w][ok], r['hi_ref'][w][ok]):.2f}"
            print(f"<!-- {sim} {kw or ''}, {scope}: {ratios} -->")
        print(f"<!-- {sim}: {time.perf_counter() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
