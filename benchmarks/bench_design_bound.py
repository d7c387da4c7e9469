"""What any design of the adaptive sweep's family must spend to reach the grid's B_crit precision: a bound from the
decision rule's own linearization (docs/sweeps.md, "The decision rule"), not a measurement.

The fit ``log S(B) = log(S_min + E_min/B)`` linearized in ``p = (log S_min, log E_min)``: a batch size with ``k``
seeds at its best setting adds ``k g g' / sigma^2`` to the information matrix ``F``, ``g(B) = (S_min, E_min/B) /
S(B)``, and ``Var log B_crit = a' F^-1 a`` with ``a = (-1, 1)``. A design gives each batch size 0 or 2..K seeds
at its best learning rate plus one trial at each of the two neighbouring learning rates (what bracketing the best
needs; each costed ``--neighbour-cost`` times a best trial, they run longer). The grid: 4 learning rates x 3 seeds
at every batch size. A trial at B costs ``B S(B)`` examples, its length set by the hardest target. Printed, per
``K``: the cheapest designs whose variance at every target is at most the grid's, as a fraction of the grid's
examples. With ``K = 3`` (the grid's own seeds) no design holds more information than the grid's best settings
(``F`` grows with every ``k``), so the bound is 3 seeds everywhere.

``--edge-neighbours-only``: the two neighbours only at the smallest and the largest batch size a design uses, the
ones between bracketed by them (what a best learning rate monotone in B would allow: an inner batch size's best lr
lies between its neighbouring batch sizes'; not what the product assumes: issue 44's ceiling, benchmarks/RESULTS.md).

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_design_bound.py [--b-crit 15 28] [--max-seeds 3 4 6]
    [--neighbour-cost 1.1] [--edge-neighbours-only]
(defaults: the tiny-DiT demo's batch sizes and its two targets' B_crit).
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np


def rows(batch_sizes: np.ndarray, b_crit: float) -> np.ndarray:
    s = 1.0 + b_crit / batch_sizes  # S(B) / S_min
    return np.stack([1.0 / s, (b_crit / batch_sizes) / s], axis=1)


def var_log_b_crit(k: np.ndarray, g: np.ndarray) -> float:
    a = np.array([-1.0, 1.0])
    f = (k[:, None, None] * g[:, :, None] * g[:, None, :]).sum(axis=0)
    return float(a @ np.linalg.solve(f, a))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=float, nargs="+", default=[8, 16, 32, 64, 128])
    ap.add_argument("--b-crit", type=float, nargs="+", default=[15.0, 28.0])
    ap.add_argument("--max-seeds", type=int, nargs="+", default=[3, 4, 6])
    ap.add_argument("--neighbour-cost", type=float, default=1.1)
    ap.add_argument("--edge-neighbours-only", action="store_true")
    a = ap.parse_args()
    bs = np.array(a.batch_sizes)
    gs = [rows(bs, bc) for bc in a.b_crit]
    cost = bs * (1.0 + max(a.b_crit) / bs)  # examples of one trial at the best setting, in units of S_min
    grid_cost = 4 * 3 * cost.sum()
    grid_var = [var_log_b_crit(np.full(len(bs), 3.0), g) for g in gs]
    for top in a.max_seeds:
        found = []
        for k in itertools.product([0, *range(2, top + 1)], repeat=len(bs)):
            k = np.array(k, dtype=float)
            if (k > 0).sum() < 3:
                continue
            if all(var_log_b_crit(k, g) <= v * (1 + 1e-9) for g, v in zip(gs, grid_var, strict=True)):
                used = np.flatnonzero(k > 0)
                bracketed = used[[0, -1]] if a.edge_neighbours_only else used
                spent = (k * cost).sum() + 2 * a.neighbour_cost * cost[bracketed].sum()
                found.append((spent / grid_cost, tuple(int(x) for x in k)))
        found.sort()
        best = ", ".join(f"{c:.2f} {dict(zip(bs.astype(int).tolist(), d, strict=True))}" for c, d in found[:3])
        print(f"up to {top} seeds per setting: cheapest designs at the grid's precision (examples / grid's): {best}")


if __name__ == "__main__":
    main()
