"""Does the noisy quadratic model's B_crit lean low (issue 45), and does the local crossing fit change it? Grid sweeps
of ``examples/quadratic.yaml`` simulated in-process (``tests.oracles.nqm.simulate_sweep``, 3 seeds per setting)
analysed at automatic targets with the first passage and with the local fit (:mod:`analysis.fits.crossing`), against
the closed form over the same learning rates (``closed_form_b_crit``): per target the ratio estimate / closed form,
and at the trusted targets the interval's misses by side. ``stopping.behind`` replays each sweep with the rule on
(analysis.decisions.stop_behind_replay: 4 trials at once, launched centre-out as a grid with the rule on does) and
analyses what is left with the local fit: the examples it kept, and the same columns (issue 44).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_nqm_lean.py --sweeps 8 --first-seed 6
    PYTHONPATH=. .venv/bin/python benchmarks/bench_nqm_lean.py --sweeps 30 --variants local behind
"""

from __future__ import annotations

import argparse
import functools
import time
from unittest import mock

import numpy as np

from analysis.decisions.stop_behind_replay import centre_out, replay
from analysis.fits import steps as steps_mod
from analysis.fits import sweep_fit

VARIANTS = {  # name, local crossing fit, stopping.behind replayed
    "first": ("first passage", False, False),
    "local": ("local fit", True, False),
    "behind": ("local fit, stopping.behind", True, True),
}


def main() -> None:
    from analysis.reporting.report import analyze
    from orchestrator.specs.sweep_spec import load_spec
    from tests.oracles.nqm import closed_form_b_crit, simulate_sweep
    from trainables.nqm_trial import QuadraticConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=8)
    ap.add_argument("--first-seed", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=3, help="seeds per setting")
    ap.add_argument("--bootstrap", type=int, default=400)
    ap.add_argument("--variants", nargs="+", default=["first", "local"], choices=list(VARIANTS))
    a = ap.parse_args()
    spec = load_spec("examples/quadratic.yaml", ["storage=/tmp/bench-nqm-unused"])
    keys = ("dim", "h_decay", "noise_scale", "theta0")
    h, c, th = QuadraticConfig.from_dict({k: v for k, v in spec.fixed.items() if k in keys}).problem()
    lrs, bs = np.array(spec.nuisance["lr"]), np.array(spec.batch_sizes)
    truth: dict[float, float] = {}
    print("| variant | targets | median ratio to the closed form | below / above 1 | trusted: n, truth below / "
          "above the interval | examples kept |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    t0 = time.perf_counter()
    for key in a.variants:
        name, local, stop = VARIANTS[key]
        ratios, trusted_below, trusted_above, n_trusted, kept = [], 0, 0, 0, []
        with mock.patch.object(sweep_fit, "steps_to_target", functools.partial(steps_mod.steps_to_target, local=local)):
            for sw in range(a.first_seed, a.first_seed + a.sweeps):
                runs = simulate_sweep(h, c, th, bs, lrs, seeds=a.seeds, max_steps=spec.stopping["max_steps"],
                                      target_loss=spec.stopping["target_loss"], seed=sw)  # fmt: skip
                if stop:
                    cut = replay(runs, 4, order=centre_out(runs))
                    kept.append(cut.examples_ratio)
                    runs = cut.runs
                for t in analyze(runs, bootstrap=a.bootstrap, plots=False, seed=sw)["targets"]:
                    y = t["target"]
                    if y not in truth:
                        truth[y] = closed_form_b_crit(h, c, th**2, y, bs, lrs=lrs).b_crit
                    ratios.append(t["b_crit"] / truth[y])
                    if not t["flags"] and None not in t["b_crit_ci"]:
                        n_trusted += 1
                        trusted_below += truth[y] < t["b_crit_ci"][0]
                        trusted_above += truth[y] > t["b_crit_ci"][1]
        r = np.array(ratios)
        print(
            f"| {name} | {len(r)} | {np.median(r):.3f} | {int((r < 1).sum())} / {int((r > 1).sum())} | "
            f"{n_trusted}, {trusted_below} / {trusted_above} | {np.median(kept) if kept else 1.0:.3f} |"
        )
    print(f"<!-- {a.sweeps} sweeps (seeds {a.first_seed}..), {a.seeds} seeds per setting, bootstrap {a.bootstrap}, "
          f"{time.perf_counter() - t0:.0f} s -->")  # fmt: skip


if __name__ == "__main__":
    main()
