"""stopping.behind, side by side: the examples a sweep spends with the rule on and off, and whether its answer moves.

Each sweep -- a simulated one (``--shapes``, tests/oracles/synth_shapes.py) or a recorded one (``--dirs``, e.g. runs
of examples/tiny.yaml) -- is replayed on a clock (analysis.decisions.stop_behind_replay: ``--concurrency`` trials at
once, each its recorded seconds, or its examples; the rule deciding after every evaluation), in the table's order or
centre-out in learning rate per batch size (``--order centre``: the grid's middle lr first, then outwards, as a grid
sweep with the rule on launches them: analysis.decisions.stop_behind.centre_first). Printed
per sweep: trials stopped, examples and clock kept (rule on / off), and at every target (automatic ones; the demo's
0.2097 and 0.1802 for a recorded tiny-DiT sweep) of the global loss and each bin, how far B_crit and its 90%
interval moved and whether a flag changed.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_stop_behind.py --shapes issue evals10 --sweeps 5 --order centre
    PYTHONPATH=. .venv/bin/python benchmarks/bench_stop_behind.py --dirs runs/tiny --concurrency 2
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "analysis"))

from analysis.decisions.stop_behind_replay import centre_out, replay  # noqa: E402
from analysis.fits.sweep_fit import analyze_metric  # noqa: E402
from analysis.sources.loaders import load_sweep_dir  # noqa: E402

DEMO_TARGETS = [0.2097, 0.1802]


def compare(full, cut, metric: str, targets) -> tuple[float, float, int, int, int]:
    """(max |B_crit ratio - 1|, max |interval end ratio - 1|, targets that lost a flag, targets that gained one,
    targets compared)."""
    a = analyze_metric(full, metric, targets=targets, bootstrap=1000, seed=0, strict=False)
    b = analyze_metric(cut, metric, targets=[t["target"] for t in a], bootstrap=1000, seed=0, strict=False)
    got = {t["target"]: t for t in b}
    d_b = d_ci = 0.0
    lost = added = 0
    for t in a:
        u = got.get(t["target"])
        if u is None:
            lost += 1
            continue
        d_b = max(d_b, abs(u["b_crit"] / t["b_crit"] - 1))
        for p, q in zip(t["b_crit_ci"], u["b_crit_ci"], strict=True):
            if p and q:
                d_ci = max(d_ci, abs(q / p - 1))
        lost += bool(set(t["flags"]) - set(u["flags"]))
        added += bool(set(u["flags"]) - set(t["flags"]))
    return d_b, d_ci, lost, added, len(a)


def one(name: str, runs, concurrency: int, order: str, tiny: bool) -> dict:
    rows = centre_out(runs) if order == "centre" else None
    on = replay(runs, concurrency, order=rows)
    off = replay(runs, concurrency, order=rows, on=False)
    metrics = [m for m in runs.metric_names() if m == "eval/loss" or m.startswith("eval/loss/bin")]
    worst = [0.0, 0.0, 0, 0, 0]
    for m in metrics:
        d = compare(runs, on.runs, m, DEMO_TARGETS if tiny and m == "eval/loss" else None)
        worst = [max(worst[0], d[0]), max(worst[1], d[1]), *(w + x for w, x in zip(worst[2:], d[2:], strict=True))]
    ratio = on.seconds / off.seconds if off.seconds else float("nan")
    print(
        f"{name}: stopped {len(on.stops)}/{len(runs.trial_ids)} trials; examples kept {on.examples_ratio:.3f}, "
        f"clock {ratio:.3f} of the rule off; B_crit moved at most {worst[0]:.1e}, interval "
        f"{worst[1]:.1e}; of {worst[4]} targets {worst[2]} lost a flag, {worst[3]} gained one",
        flush=True,
    )
    return {"examples": on.examples_ratio, "clock": ratio, "moved": worst[0], "lost": worst[2], "added": worst[3],
            "targets": worst[4]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=[])
    ap.add_argument("--sweeps", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--dirs", nargs="*", default=[])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--order", choices=["table", "centre"], default="table")
    a = ap.parse_args()
    out = []
    for d in a.dirs:
        out.append(one(d, load_sweep_dir(d), a.concurrency, a.order, tiny=True))
    if a.shapes:
        from tests.oracles.synth_shapes import SHAPES
        from tests.oracles.synth_sweeps import simulate

        for shape in a.shapes:
            for k in range(a.sweeps):
                runs = simulate(np.random.default_rng(a.first_seed + k), SHAPES[shape])
                out.append(one(f"{shape} #{a.first_seed + k}", runs, a.concurrency, a.order, tiny=False))
    if out:
        ex = np.array([r["examples"] for r in out])
        clock = np.array([r["clock"] for r in out])
        print(
            f"all {len(out)}: examples kept median {np.median(ex):.3f} (range {ex.min():.3f}-{ex.max():.3f}), clock "
            f"median {np.median(clock):.3f}; B_crit moved at most {max(r['moved'] for r in out):.1e}; of "
            f"{sum(r['targets'] for r in out)} targets {sum(r['lost'] for r in out)} lost a flag, "
            f"{sum(r['added'] for r in out)} gained one"
        )


if __name__ == "__main__":
    main()
