"""Timestep samplers on the binned noisy quadratic model: measured vs exact vs predicted gain in steps-to-target.

For a sweep of ``examples/alloc-quadratic.yaml`` (``bcrit sweep``), per batch size, side by side in one run:

- ``measured``: best-lr steps-to-target of the ``noise`` trials over the ``uniform`` trials' (seeds averaged, the
  sweep's own lr subsets; ``analysis.decisions.allocation_report.measured``), with the seeds' SE;
- ``exact``: the same ratio from the closed-form expected loss (``tests.oracles.nqm_alloc``) over the same lr
subset;
- ``predicted``: McCandlish's ``(B + B_simple(p)) / (B + B_simple(u))`` with ``B_simple`` of the exact per-bin
  statistics (``m_k = |G|^2 + s_k tr C``, ``E|G|^2 = sum h^2 E theta^2``) at the uniform best lr's crossing
  (``analysis.core.allocation.second_moment``): the prediction ``bcrit allocate`` makes from measurements, fed exact
  ones.

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_alloc_nqm.py runs/alloc-quadratic [--target 0.3]
"""

from __future__ import annotations

import argparse

import numpy as np

from analysis.core import nqm_noise as nn
from analysis.core.allocation import second_moment, steps_ratio
from analysis.decisions.allocation_report import measured
from analysis.sources.loaders import load_sweep_dir
from orchestrator.specs.sweep_spec import load_spec
from tests.oracles import nqm_alloc as na
from tests.oracles.nqm import _arrays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--target", type=float, default=0.3)
    args = ap.parse_args()
    spec = load_spec(f"{args.sweep_dir}/sweep_spec.yaml")
    f = spec.fixed
    dim, K = int(f["dim"]), int(f["timestep_bins"])
    h = np.arange(1, dim + 1, dtype=np.float64) ** -float(f["h_decay"])
    c, m0 = float(f["noise_scale"]) * h, np.full(dim, float(f["theta0"]) ** 2)
    s, q = nn.bin_noise(K, float(f["bin_noise_ratio"])), np.full(K, 1.0 / K)
    p = nn.noise_allocation(s, q, float(f["alloc_floor"]))
    meas = measured(load_sweep_dir(args.sweep_dir), args.target)
    print(f"allocation p = {np.round(p, 4).tolist()}  (s = {np.round(s, 3).tolist()})")
    print("| B | uniform steps (meas / exact) | noise steps (meas / exact) | measured ratio | exact | predicted |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b in spec.batch_sizes:
        lrs = np.array(spec.splits[b][0].lr or spec.nuisance["lr"], dtype=np.float64)
        max_steps = spec.stopping["max_steps"][b]
        su, lru = na.best_steps(h, c, m0, b, args.target, s, q, q, lrs, max_steps)
        sp, _ = na.best_steps(h, c, m0, b, args.target, s, q, p, lrs, max_steps)
        pred = float("nan")
        if np.isfinite(su):  # exact state at the uniform best lr's crossing
            hh, cc, mm = _arrays(h, c, m0)
            m_t = _state_at(hh, cc, mm, lru, b, su)
            g2, trc = float(np.sum(h * h * m_t)), float(c.sum())
            mk = g2 + s * trc
            bs_u = second_moment(mk, q, q) / g2 - 1.0
            bs_p = second_moment(mk, p, q) / g2 - 1.0
            pred = float(steps_ratio(bs_p, bs_u, b))
        mu = meas.get("uniform", {}).get("points", {}).get(b, {})
        mn = meas.get("noise", {}).get("points", {}).get(b, {})
        r = mn.get("steps", np.nan) / mu.get("steps", np.nan) if mu and mn else np.nan
        se = r * np.hypot(mn.get("log_se", np.nan), mu.get("log_se", np.nan)) if mu and mn else np.nan
        print(
            f"| {b} | {mu.get('steps', np.nan):.1f} / {su:.1f} | {mn.get('steps', np.nan):.1f} / {sp:.1f} | "
            f"{r:.3f} ± {se:.3f} | {sp / su:.3f} | {pred:.3f} |"
        )
    for name, m in meas.items():
        if "b_crit" in m:
            print(f"{name}: B_crit {m['b_crit']:.1f} interval {m['b_crit_ci']} flags {m['flags']}")


def _state_at(h, c, m0, lr, B, t):
    """``E theta_i^2`` at real step ``t`` of the plain (uniform) NQM recursion, per coordinate."""
    r = (1.0 - lr * h) ** 2
    qq = lr * lr * c / B
    m_star = qq / (1.0 - r)
    return m_star + r**t * (m0 - m_star)


if __name__ == "__main__":
    main()
