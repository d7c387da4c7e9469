"""Where a simulator's B_crit leans, split by the flags of its targets (issue 45): point estimates only (no bootstrap,
fast), for many sweeps, globally and per timestep bin; the mean signed error in log of the plain fit and of
``b_crit_refined`` (the parabola in log lr) over the trusted targets, the targets with each flag, and all of them.
With ``--noise-free`` the seeds' jitter and the evaluation noise are set to 0 (what is left is the learning-rate grid:
how far each batch size's best grid lr sits from its optimum), so a lean there is not the noise's.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_lean_by_flag.py --shapes t3 --draws 200
    PYTHONPATH=. .venv/bin/python benchmarks/bench_lean_by_flag.py --shapes t3 --draws 200 --noise-free
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "analysis"))

from analysis.core import metrics as m  # noqa: E402
from analysis.fits import sweep_fit  # noqa: E402

IGNORED = {"lr_at_divergence"}  # a flag the bootstrap's limit sets, absent without one: not counted here


def errors(shape: str, draws: int, first_seed: int, noise_free: bool) -> dict:
    """{(scope, flags): [(log error plain, log error refined), ...]} over ``draws`` sweeps of ``shape``."""
    from tests.oracles.synth_shapes import SHAPES
    from tests.oracles.synth_sweeps import simulate, truth

    sw = SHAPES[shape]
    if noise_free:
        sw = replace(sw, rate_jitter=0.0, sigma=0.0, eval_noise=0.0)
    out = collections.defaultdict(list)
    for d in range(draws):
        runs = simulate(np.random.default_rng(first_seed + d), sw)
        for k in range(len(sw.bins) + 1):
            metric = m.EVAL_LOSS if k == 0 else m.per_bin(m.EVAL_LOSS_BIN, k - 1)
            res = sweep_fit.analyze_metric(runs, metric, None, bootstrap=0, seed=d, strict=False, notes=[],
                                           calibrate=False)  # fmt: skip
            for r in res:
                tr = truth(sw, metric, r["target"])
                key = ("bins" if k else "global", tuple(sorted(set(r["flags"]) - IGNORED)) or ("trusted",))
                out[key].append((np.log(r["b_crit"] / tr), np.log(r["b_crit_refined"] / tr)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["t3"])
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--first-seed", type=int, default=700)
    ap.add_argument("--noise-free", action="store_true")
    a = ap.parse_args()
    print("| shape | scope | targets' flags | n | plain: mean (SE) | refined: mean | sd: plain / refined |")
    print("|---|---|---|---:|---:|---:|---:|")
    for shape in a.shapes:
        t0 = time.perf_counter()
        rec = errors(shape, a.draws, a.first_seed, a.noise_free)
        for scope in ("global", "bins"):
            keys = sorted((k for k in rec if k[0] == scope), key=lambda k: -len(rec[k]))
            every = np.array([e for k in keys for e in rec[k]])
            for name, v in [*((", ".join(k[1]), np.array(rec[k])) for k in keys if len(rec[k]) >= 20), ("all", every)]:
                se = v[:, 0].std(ddof=1) / np.sqrt(len(v))
                print(f"| {shape} | {scope} | {name} | {len(v)} | {v[:, 0].mean():+.4f} ({se:.4f}) | "
                      f"{np.nanmean(v[:, 1]):+.4f} | {v[:, 0].std():.4f} / {np.nanstd(v[:, 1]):.4f} |")  # fmt: skip
        print(
            f"<!-- {shape}: {a.draws} sweeps from seed {a.first_seed}{', noise-free' if a.noise_free else ''}, "
            f"{time.perf_counter() - t0:.0f} s -->",
            flush=True,
        )


if __name__ == "__main__":
    main()
