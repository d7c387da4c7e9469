"""Is `bcrit probe`'s standard error of B_simple honest? Nominal SE vs the observed spread over probe seeds.

For one checkpoint, ``--seeds`` independent probes (seeds 0..S-1; with ``--bins 1`` bin 0 covers all timesteps
too, so each seed gives two independent probes of the global row: 10 seeds, 20 probes) each draw ``--reps-max``
repetitions per bin with the probe's own code (``trainables.probe.probe_draws``: repetition ``r`` of a seed is the
same whatever ``reps`` is, so the first ``R`` repetitions *are* a probe with ``--reps R``). For each ``R`` in
``--reps`` a probe's repetitions are cut into ``reps_max / R`` disjoint probes of ``R``; each gives
``B_simple ± SE`` exactly as ``bcrit probe`` does (``trainables.probe.probe_row``). Per row and ``R`` we report

- ``spread``: the standard deviation of the probes' B_simple (what the SE claims to be),
- ``rms_se``: the root-mean-square nominal SE, and ``honesty = rms_se / spread`` (1 = honest; < 1 = overconfident),
  with a bootstrap 68% interval over probes,
- ``cover1`` / ``cover2``: the fraction of probes whose ``|B_simple - pooled| <= 1 SE / 2 SE`` (normal: 0.68 / 0.95),
  ``pooled`` being the estimate from every repetition of every seed (``S x reps_max`` of them).

``--resample R,...`` also assesses probes of ``R`` repetitions drawn with replacement from that pool (``--draws``
of them): the bootstrap stand-in for more seeds, for ``R`` larger than a CPU budget allows to draw afresh
(the pool is the empirical distribution of one repetition; kind "resampled" in the table).

Run (CPU; one torch thread is several times faster on a busy machine; ~4 min; writes JSON, prints a markdown table):
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/bench_probe_se.py --bins 2 --seeds 20 --out /tmp/p.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from analysis.core.gns import b_simple_with_se


def make_checkpoint(root: str, steps: int) -> str:
    """The README's example trial (examples/trial.yaml) in-process (W=1, A=4: the same B=64), ``steps`` steps."""
    from orchestrator.specs.yaml_overrides import load_yaml
    from trainables.config import TrialConfig
    from trainables.trial import run_local

    here = os.path.dirname(os.path.abspath(__file__))
    d = load_yaml(os.path.join(here, "..", "examples", "trial.yaml"))
    d.update(num_workers=0, grad_accum=None, max_steps=steps)
    return run_local(TrialConfig.from_dict(d), checkpoint_root=root).checkpoints[-1]


def jackknife_se(g2: np.ndarray, tr: np.ndarray) -> float:
    """Leave-one-out jackknife SE of ``mean(tr) / mean(g2)`` (for comparison with the delta method)."""
    n = g2.size
    loo = (tr.sum() - tr) / (g2.sum() - g2)  # (n,) ratio without repetition i
    return float(np.sqrt((n - 1) / n * np.sum((loo - loo.mean()) ** 2)))


def honesty(estimates: np.ndarray, ses: np.ndarray, pooled: float, rng: np.random.Generator) -> dict:
    spread = float(np.std(estimates, ddof=1))
    rms = float(np.sqrt(np.mean(ses**2)))
    boot = []
    n = len(estimates)
    for _ in range(2000):
        i = rng.integers(0, n, n)
        s = np.std(estimates[i], ddof=1)
        if s > 0:
            boot.append(np.sqrt(np.mean(ses[i] ** 2)) / s)
    z = np.abs(estimates - pooled) / ses
    return {
        "probes": n,
        "mean": float(np.mean(estimates)),
        "spread": spread,
        "rms_se": rms,
        "honesty": rms / spread,
        "honesty_lo": float(np.percentile(boot, 16)),
        "honesty_hi": float(np.percentile(boot, 84)),
        "cover1": float(np.mean(z <= 1.0)),
        "cover2": float(np.mean(z <= 2.0)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None, help="trial checkpoint (default: train examples/trial.yaml)")
    ap.add_argument("--steps", type=int, default=60, help="steps of the default checkpoint's trial")
    ap.add_argument("--bins", type=int, default=1, help="1: bin 0 is a second global probe per seed")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--reps-max", type=int, default=16)
    ap.add_argument("--reps", default="8,16", help="probe repetitions to assess (divisors of --reps-max)")
    ap.add_argument("--resample", default="16,32,64,128", help="repetitions to assess by resampling the pool")
    ap.add_argument("--draws", type=int, default=2000, help="resampled probes per R")
    ap.add_argument("--b", type=int, default=16)
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--out", default=None, help="write the results as JSON (and the raw draws to OUT.draws)")
    ap.add_argument("--from-draws", default=None, metavar="FILE", help="analyse the OUT.draws of an earlier run")
    args = ap.parse_args()
    from trainables.probe import probe_draws

    reps_list = [int(r) for r in args.reps.split(",")]
    if any(args.reps_max % r for r in reps_list):
        raise SystemExit(f"every --reps must divide --reps-max={args.reps_max}")
    t0 = time.perf_counter()
    probes: dict[str, list] = {}  # row -> [(g2 draws, trace draws)] per independent probe of --reps-max
    spans: dict[str, list[int]] = {}
    if args.from_draws:  # analyse the draws a (possibly interrupted) earlier run saved
        with open(args.from_draws) as f:
            saved = json.load(f)
        ckpt, probes, spans = saved["checkpoint"], saved["probes"], saved.get("spans", {})
        spans = {k: spans.get(k, [0, 999]) for k in probes}
        args.seeds = 0
    else:
        ckpt = args.checkpoint or make_checkpoint(tempfile.mkdtemp(prefix="bench-probe-se-"), args.steps)
    for s in range(args.seeds):
        _, draws = probe_draws(ckpt, bins=args.bins, b=args.b, B=args.B, reps=args.reps_max, seed=s, device="cpu")
        for k, lo, hi, g2s, trs in draws:
            # with --bins 1 bin 0 is the whole range too, drawn with other keys: a second global probe per seed
            label = "all" if k is None or args.bins == 1 else str(k)
            probes.setdefault(label, []).append((g2s, trs))
            spans[label] = [lo, hi]
        print(f"seed {s}: {time.perf_counter() - t0:.0f}s", flush=True)
        if args.out:
            with open(args.out + ".draws", "w") as f:
                json.dump({"checkpoint": ckpt, "probes": probes, "spans": spans}, f)
    rng = np.random.default_rng(0)
    rows = []
    for label, units in probes.items():
        k, (lo, hi) = label, spans[label]
        g2 = np.array([u[0] for u in units])  # (probes, reps_max)
        tr = np.array([u[1] for u in units])
        pooled, pooled_se = b_simple_with_se(g2.ravel(), tr.ravel())
        for R in reps_list:
            est, ses, jks = [], [], []
            for s in range(len(units)):
                for j in range(0, args.reps_max, R):
                    e, se = b_simple_with_se(g2[s, j : j + R], tr[s, j : j + R])
                    est.append(e)
                    ses.append(se)
                    jks.append(jackknife_se(g2[s, j : j + R], tr[s, j : j + R]))
            h = honesty(np.array(est), np.array(ses), pooled, rng)
            hj = honesty(np.array(est), np.array(jks), pooled, rng)
            rows.append({"bin": k, "timesteps": [lo, hi], "reps": R, "kind": "seeds",
                         "pooled": pooled, "pooled_se": pooled_se, **h, "jackknife": hj})  # fmt: skip
        for R in [int(r) for r in args.resample.split(",") if r]:
            idx = rng.integers(0, g2.size, size=(args.draws, R))
            pairs = [b_simple_with_se(g2.ravel()[i], tr.ravel()[i]) for i in idx]
            est, ses = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
            jks = np.array([jackknife_se(g2.ravel()[i], tr.ravel()[i]) for i in idx])
            h = honesty(est, ses, pooled, rng)
            hj = honesty(est, jks, pooled, rng)
            rows.append({"bin": k, "timesteps": [lo, hi], "reps": R, "kind": "resampled",
                         "pooled": pooled, "pooled_se": pooled_se, **h, "jackknife": hj})  # fmt: skip
    doc = {
        "checkpoint": ckpt,
        "seeds": args.seeds,
        "reps_max": args.reps_max,
        "b": args.b,
        "B": args.B,
        "seconds": time.perf_counter() - t0,
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    print(
        "| bin | reps | kind | probes | pooled B_simple | spread | rms SE | SE / spread (68%) | cover 1SE | cover 2SE "
        "| jackknife SE / spread | jackknife cover 2SE |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['bin']} | {r['reps']} | {r['kind']} | {r['probes']} | {r['pooled']:.3g} ± {r['pooled_se']:.2g} | "
            f"{r['spread']:.3g} | {r['rms_se']:.3g} | {r['honesty']:.2f} ({r['honesty_lo']:.2f}-{r['honesty_hi']:.2f}) "
            f"| {r['cover1']:.2f} | {r['cover2']:.2f} | {r['jackknife']['honesty']:.2f} "
            f"| {r['jackknife']['cover2']:.2f} |"
        )
    print(f"seconds {doc['seconds']:.0f}")


if __name__ == "__main__":
    main()
