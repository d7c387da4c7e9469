"""Is the B_crit interval right, and what did each fix of issue 12 change? Simulated sweeps with a known answer.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_coverage.py [--draws 200] [--bootstrap 1000] [--quick]``.

1. Coverage figure: ``--draws`` synthetic sweeps shaped like real ones (``tests/oracles/synth_runs.py``
   ``COVERAGE_SWEEP``: 9 batch sizes, 5 learning rates of which the top one diverges, 3 seeds per setting with 10%
   seed-to-seed scatter of the steps, trials stopped at a global target 0.2), targets 0.3 and 0.25, true
   ``B_crit = 256``: share of 90% intervals that hold 256, median |error|, mean error, interval width over the
   spread of the estimates (1 = as wide as it should be).
2. Before/after for each of the five fixes, "before" being the analysis of ``main`` before issue 12 (the minimum
   steps over all usable trials of a batch size, no censoring, interval from resampling trials), re-implemented
   here in a few lines (:func:`old_b_crit`, :func:`old_interval`).
3. The noisy quadratic model (``examples/quadratic.yaml`` simulated in-process,
``tests.oracles.nqm.simulate_sweep``)
   against its closed form on the sweep's own lr grid: error at trustworthy and at flagged targets.

``--sim old|new|both`` runs only the issue-17 comparison instead: coverage of the 90% interval at the *trusted*
(unflagged) targets, globally and per timestep bin, on ``synth_runs`` ("old") and on the independent simulator
``tests/oracles/synth_sweeps.py`` ("new"), before (the interval without the lack-of-fit term: seeds resampled only,
``analysis.fits.pareto.lack_of_fit_var`` patched to 0, which is exactly the earlier code) and after, with the median
relative width ``hi/lo - 1``: ``bench_coverage.py --sim both [--draws 40] [--bootstrap 400] [--ablations]``.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from analysis.core import metrics as m
from analysis.fits import flags as fl
from analysis.fits import pareto
from analysis.fits.steps import steps_to_target, usable
from analysis.fits.sweep_fit import analyze_metric
from tests.oracles.synth_runs import COVERAGE_SWEEP, COVERAGE_TARGETS, coverage_draws, synth_runs

TRUTH = 256.0


def old_best(runs, metric: str, targets: list[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pre-issue-12 points: per batch size the fewest steps over all usable trials (seeds and lrs mixed)."""
    series = runs.series(metric)
    n, ok = len(runs.trial_ids), usable(runs)
    steps = steps_to_target(series, n, targets)
    bs = np.unique(runs.batch_size[ok])
    best = np.array([[np.min(s[ok & (runs.batch_size == b)]) for b in bs] for s in steps])
    return bs, best, steps, ok


def old_b_crit(runs, metric: str, targets: list[float]) -> list[float]:
    bs, best, _, _ = old_best(runs, metric, targets)
    return [pareto.fit_pareto(bs, b).b_crit for b in best]


def old_interval(runs, metric: str, targets: list[float], n_boot: int, rng, level: float = 0.9):
    """The pre-issue-12 interval: resample trials within each batch size, re-take the minimum, refit."""
    bs, best, steps, ok = old_best(runs, metric, targets)
    out = []
    for j, s in enumerate(steps):
        reps = np.empty((n_boot, len(bs)))
        for i, b in enumerate(bs):
            rows = np.flatnonzero(ok & (runs.batch_size == b))
            reps[:, i] = s[rows[rng.integers(0, len(rows), (n_boot, len(rows)))]].min(axis=1)
        fit = pareto.fit_pareto(bs, best[j])
        s_min, e_min = pareto.fit_pareto_batched(bs, reps, np.log([fit.s_min, fit.e_min]))
        out.append((fit.b_crit, *pareto.percentile_ci(e_min / s_min, level)))
    return out


def _stats(err) -> str:
    err = np.asarray(err)
    return f"mean {err.mean():+.3f} ± {err.std() / np.sqrt(len(err)):.3f}, median |err| {np.median(np.abs(err)):.3f}"


def coverage_figure(draws: int, n_boot: int) -> None:
    t0 = time.perf_counter()
    r = coverage_draws(draws=draws, bootstrap=n_boot)
    print(f"## 1. coverage: {draws} sweeps ({COVERAGE_SWEEP}, targets {COVERAGE_TARGETS}), bootstrap {n_boot}")
    print(
        f"new: coverage of the 90% interval {r['coverage']:.3f}, median |error| {r['median_error']:.3f}, mean error "
        f"{r['bias']:+.3f}, width / spread {r['width_ratio']:.2f}, flagged {r['flagged'].mean():.2f} "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    rng = np.random.default_rng(0)
    est, hit, logw = [], [], []
    for d in range(draws):
        runs = synth_runs(np.random.default_rng(100 + d), **COVERAGE_SWEEP)
        for b, lo, hi in old_interval(runs, m.EVAL_LOSS, list(COVERAGE_TARGETS), n_boot, rng):
            est.append(b)
            hit.append(lo <= TRUTH <= hi)
            logw.append(np.log(hi / lo) / 2)
    est = np.array(est)
    ratio = np.mean(logw) / (1.6449 * np.std(np.log(est)))
    print(
        f"old: coverage {np.mean(hit):.3f}, median |error| {np.median(np.abs(est / TRUTH - 1)):.3f}, mean error "
        f"{np.mean(est / TRUTH - 1):+.3f}, width / spread {ratio:.2f}"
    )


def _compare(name: str, draws: int, metric: str, target: float, truth: float, **kw) -> None:
    new, old, ref, flags = [], [], [], Counter()
    for d in range(draws):
        runs = synth_runs(np.random.default_rng(1000 + d), **kw)
        res = analyze_metric(runs, metric, [target], bootstrap=0, strict=False, notes=[])
        old.append(old_b_crit(runs, metric, [target])[0] / truth - 1)
        for r in res:
            new.append(r["b_crit"] / truth - 1)
            ref.append(r["b_crit_refined"] / truth - 1)
            flags.update(r["flags"] or ["(none)"])
    print(f"{name} ({draws} sweeps): old {_stats(old)}")
    print(f"    new {_stats(new)} (refined: {_stats(ref)}); flags {dict(flags)}")


def fixes(draws: int) -> None:
    print("\n## 2. before/after per fix (error = B_crit / truth - 1)")
    kw = dict(seeds=1, sigma=0.05, bins=1, stop_at=0.3, bin_e_min=(200 * 1024,), bin_lr_opt=(-1.0,), diverge_factor=8)
    _compare("fix 1, censoring: bin target 0.6 after a global stop at eval/loss 0.3, bin B_crit 1024", draws,
             m.per_bin(m.EVAL_LOSS_BIN, 0), 0.6, 1024, **kw)  # fmt: skip
    _compare("fix 2, extrapolation: batch sizes 1024..8192, B_crit 256 below them", draws, m.EVAL_LOSS, 0.3, 256,
             seeds=1, batch_sizes=(1024, 2048, 4096, 8192))  # fmt: skip
    _compare("fix 2, coarse steps: 8 evaluations per trial", draws, m.EVAL_LOSS, 0.3, 256, seeds=1, n_evals=8)
    _compare("fix 3, near floor: eval noise 0.003, target 0.13 (floor 0.1)", draws, m.EVAL_LOSS, 0.13, 256,
             seeds=1, sigma=0.05, eval_noise=0.003, n_evals=200, budget_u=40)  # fmt: skip
    _compare("fix 5, seeds: 3 seeds, scatter 10% x (256/B)^0.25", draws, m.EVAL_LOSS, 0.25, 256,
             seeds=3, sigma=0.1, sigma_power=0.25)  # fmt: skip
    _compare("fix 5, coarse lr grid: 6 lrs 2x apart, optimum drifting off the grid", max(3, draws // 5), m.EVAL_LOSS,
             0.3, 256, seeds=1, sigma=0.02, lr_factors=(0.125, 0.25, 0.5, 1, 2, 4), lr_opt=0.25, lr_drift=0.0625,
             diverge_factor=8)  # fmt: skip
    _compare("fix 5, lr at edge: optimum below the grid", max(3, draws // 5), m.EVAL_LOSS, 0.3, 256, seeds=1, lr_opt=-2)


def quadratic(sweeps: int, n_boot: int) -> None:
    from analysis.reporting.report import analyze
    from orchestrator.specs.sweep_spec import load_spec
    from tests.oracles.nqm import closed_form_b_crit, simulate_sweep
    from trainables.nqm_trial import QuadraticConfig

    spec = load_spec("examples/quadratic.yaml", ["storage=/tmp/bench-coverage-unused"])
    keys = ("dim", "h_decay", "noise_scale", "theta0")
    h, c, th = QuadraticConfig.from_dict({k: v for k, v in spec.fixed.items() if k in keys}).problem()
    lrs, bs = np.array(spec.nuisance["lr"]), np.array(spec.batch_sizes)
    rows: dict[str, list] = {"trustworthy": [], "flagged": []}
    by_flag: dict[str, list] = {}
    stop_err, stop_flag, covered = [], [], []
    truth_of: dict[float, float] = {}
    for sw in range(sweeps):
        runs = simulate_sweep(h, c, th, bs, lrs, max_steps=spec.stopping["max_steps"],
                              target_loss=spec.stopping["target_loss"], seed=sw)  # fmt: skip
        res = analyze(runs, bootstrap=n_boot, plots=False, seed=sw)["targets"]
        res += analyze(runs, targets=[spec.stopping["target_loss"]], bootstrap=0, plots=False)["targets"]
        for i, t in enumerate(res):
            y = t["target"]
            if y not in truth_of:
                truth_of[y] = closed_form_b_crit(h, c, th**2, y, bs, lrs=lrs).b_crit
            e = t["b_crit"] / truth_of[y] - 1
            if i == len(res) - 1:
                stop_err.append(e)
                stop_flag.append(fl.NEAR_FLOOR in t["flags"])
                continue
            rows["flagged" if t["flags"] else "trustworthy"].append(e)
            for f in t["flags"]:
                by_flag.setdefault(f, []).append(e)
            if not t["flags"]:
                lo, hi = t["b_crit_ci"]
                covered.append(lo <= truth_of[y] <= hi)
    print(f"\n## 3. quadratic: {sweeps} in-process sweeps of examples/quadratic.yaml, 8 automatic targets each")
    for k, v in rows.items():
        print(f"{k} targets ({len(v)}): {_stats(v)}, within 25%: {np.mean(np.abs(v) <= 0.25):.2f}")
    for f, v in by_flag.items():
        print(f"  flagged {f} ({len(v)}): {_stats(v)}")
    print(f"trustworthy targets: the 90% interval (ci_resamples=trials) holds the closed form {np.mean(covered):.2f}")
    print(
        f"global target {spec.stopping['target_loss']}: {_stats(stop_err)}; flagged near_floor {np.mean(stop_flag):.2f}"
    )


# variants for --ablations, (simulator, its options): which feature the seed bootstrap misses (new: Sweep fields)
ABLATIONS = {
    "new, optimum on the middle grid lr at every B": ("new", dict(lr_slope=0.0, lr_opt_spread=0.0)),
    "new, no seed-to-seed lr jitter": ("new", dict(lr_jitter=0.0)),
    "new, lr jitter 0.4 octave": ("new", dict(lr_jitter=0.4)),
    "new, coarse evaluations (20 per trial)": ("new", dict(n_evals=20)),
    "new, no evaluation noise": ("new", dict(eval_noise=0.0)),
    "new, 2x seed noise (sigma 0.08)": ("new", dict(sigma=0.08)),
    "old, one seed per setting (ci_resamples trials)": ("old", dict(seeds=1)),
}


def _trusted_rows(sim: str, draws: int, n_boot: int, **kw) -> dict:
    """{(before|after, global|bins): summary} for one simulator."""
    from unittest import mock

    from tests.oracles.coverage_sims import coverage_records, summary

    out = {}
    for when in ("before", "after"):
        t0 = time.perf_counter()
        if when == "before":
            with mock.patch.object(pareto, "lack_of_fit_var", lambda *a: 0.0):
                rec = coverage_records(sim, draws, n_boot, calibrate=False, **kw)
        else:
            rec = coverage_records(sim, draws, n_boot, calibrate=False, **kw)
        for scope, which in (("global", ~rec["is_bin"]), ("bins", rec["is_bin"])):
            out[when, scope] = summary(rec, which & rec["trusted"]) | {"all": int(which.sum())}
        out[when, "seconds"] = time.perf_counter() - t0
    return out


def trusted_coverage(sims: list[str], draws: int, n_boot: int, ablations: bool) -> None:
    print(f"## trusted targets: coverage of the 90% interval, {draws} sweeps per simulator, bootstrap {n_boot}")
    print("| simulator | scope | trusted targets (of all) | coverage before | after | truth below / above the "
          "interval, after | median width before | after | median abs. error |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    runs = [(sim, sim, {}) for sim in sims]
    if ablations:
        runs += [(sim, label, kw) for label, (sim, kw) in ABLATIONS.items() if sim in sims]
    for sim, label, kw in runs:
        r = _trusted_rows(sim, draws, n_boot, **kw)
        for scope in ("global", "bins"):
            b, a = r["before", scope], r["after", scope]
            print(
                f"| {label} | {scope} | {a['n']} ({a['all']}) | {b['coverage']:.3f} | **{a['coverage']:.3f}** | "
                f"{a['truth_below']:.3f} / {a['truth_above']:.3f} | {b['width']:.3f} | {a['width']:.3f} | "
                f"{a['error']:.3f} |"
            )
        print(f"<!-- {label}: {r['before', 'seconds']:.0f} s before, {r['after', 'seconds']:.0f} s after -->")


def shapes_coverage(names: list[str], draws: int, n_boot: int, first_seed: int) -> None:
    """Issue 30: the 90% interval at the trusted targets on every shape of ``synth_shapes``, before (the nominal
    level) and after (the level calibrated by the parametric double bootstrap), on the same sweeps."""
    from tests.oracles.coverage_sims import coverage_records, summary

    print(f"## calibrated intervals: {draws} sweeps per shape (seeds {first_seed}..), bootstrap {n_boot}")
    print(
        "| shape | scope | trusted targets | coverage before ± SE | after ± SE | min/max over batches of 10 "
        "sweeps, after | median level after | median width before | after | width ratio | median abs. error | "
        "taken by `lr_at_divergence` (their coverage) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")  # fmt: skip
    for name in names:
        t0 = time.perf_counter()
        rec = {c: coverage_records(f"shape:{name}", draws, n_boot, first_seed, calibrate=c) for c in (False, True)}
        for scope, which in (("global", ~rec[True]["is_bin"]), ("bins", rec[True]["is_bin"])):
            b, a = (summary(rec[c], rec[c]["trusted"] & (~rec[c]["is_bin"] if scope == "global" else rec[c]["is_bin"]))
                    for c in (False, True))  # fmt: skip
            sel = which & rec[True]["trusted"]
            r = rec[True]
            hit = (r["lo"] <= r["truth"]) & (r["truth"] <= r["hi"])
            batch = [
                hit[sel & (r["draw"] // 10 == k)].mean()
                for k in range(draws // 10)
                if (sel & (r["draw"] // 10 == k)).any()
            ]
            mm = f"{min(batch):.2f} / {max(batch):.2f}" if batch else "-"
            took = (~rec[True]["is_bin"] if scope == "global" else rec[True]["is_bin"]) & r["at_divergence_only"]
            taken = f"{int(took.sum())} ({hit[took].mean():.2f})" if took.any() else "0"
            print(
                f"| {name} | {scope} | {a['n']} | {b['coverage']:.3f} ± {b['se']:.3f} | **{a['coverage']:.3f}** ± "
                f"{a['se']:.3f} | {mm} | {a['level']:.3f} | {b['width']:.3f} | {a['width']:.3f} | "
                f"{a['width'] / b['width']:.2f} | {a['error']:.3f} | {taken} |"
            )
        print(f"<!-- {name}: {time.perf_counter() - t0:.0f} s -->", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--draws", type=int, default=None, help="sweeps (default 200, or 40 with --sim)")
    p.add_argument("--bootstrap", type=int, default=None, help="replicates (default 1000, or 400 with --sim)")
    p.add_argument("--quick", action="store_true", help="fewer draws everywhere (a smoke run)")
    p.add_argument("--sim", choices=("old", "new", "both"), help="only the trusted-target coverage (issue 17)")
    p.add_argument("--ablations", action="store_true", help="with --sim: also the simulators' variants")
    p.add_argument("--shapes", nargs="*", help="only the calibrated-interval coverage on these synth_shapes (issue 30; "
                   "none named: all)")  # fmt: skip
    p.add_argument("--first-seed", type=int, default=700, help="with --shapes: the first sweep's seed")
    a = p.parse_args()
    if a.shapes is not None:
        from tests.oracles.synth_shapes import SHAPES

        shapes_coverage(a.shapes or list(SHAPES), a.draws or 40, a.bootstrap or 400, a.first_seed)
        return
    if a.sim:
        sims = ["old", "new"] if a.sim == "both" else [a.sim]
        trusted_coverage(sims, 8 if a.quick else a.draws or 40, a.bootstrap or 400, a.ablations)
        return
    a.draws = 200 if a.draws is None else a.draws
    a.bootstrap = 1000 if a.bootstrap is None else a.bootstrap
    draws = 20 if a.quick else a.draws
    coverage_figure(draws, a.bootstrap)
    fixes(10 if a.quick else 40)
    quadratic(3 if a.quick else 20, 200)


if __name__ == "__main__":
    main()
