"""A proposed batch-size schedule against constant batch sizes on the noisy quadratic model: predicted (from the
sweep's fits, analysis.schedule), measured (the trials' own steps and ``examples`` column at the target) and exact
(the NQM closed form of analysis.nqm / analysis.nqm_schedule), side by side.

    bcrit sweep examples/schedule-quadratic.yaml
    bcrit analyze runs/schedule-quadratic --targets 9.27,3.09,0.927,0.309
    bcrit schedule runs/schedule-quadratic
    bcrit sweep examples/schedule-quadratic.yaml --set name=schedule-quadratic-proposed \\
        --set storage=./runs/schedule-quadratic-proposed --set scientific.batch_sizes=[B0] \\
        --set 'fixed.batch_schedule=<the proposal>'
    python benchmarks/bench_schedule_nqm.py runs/schedule-quadratic runs/schedule-quadratic-proposed

Measured: per setting (batch size or schedule, lr) the mean over seeds of the steps and examples to the last
segment's target (interpolated in the rows, analysis.schedule.measured_to_target), then the setting with the fewest
mean steps. The proposed sweep's schedule is read from its spec (``fixed.batch_schedule``), its stage-0 lr is its
best one. Exact: the expected loss of the same trial settings (problem from the spec's ``fixed`` keys).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pyarrow.compute as pc
import yaml

from analysis import metrics as M
from analysis.loaders import load_sweep_dir
from analysis.nqm_schedule import expected_to_target_staged
from analysis.schedule import measured_to_target, propose, segments_of
from analysis.stages import BatchStages
from orchestrator.schedule_cmd import tuned_lrs
from trainables.nqm_trial import QuadraticConfig


def best_measured(sweep: str, target: float) -> dict[int, tuple[float, float, float, int]]:
    """Batch size -> (mean steps, mean examples, lr, seeds) of its best lr at ``target`` (fewest mean steps)."""
    runs = load_sweep_dir(sweep)
    tab = runs.metrics.filter(pc.equal(runs.metrics.column("metric"), M.EVAL_LOSS))
    ids = tab.column("trial_id").to_pylist()
    step, ex, val = (tab.column(c).to_numpy().astype(np.float64) for c in ("step", "examples", "value"))
    lr = dict(zip(runs.trial_ids, runs.trials.column("lr").to_pylist(), strict=True))
    per: dict[tuple[int, float], list[tuple[float, float]]] = {}
    ids_arr = np.asarray(ids)
    for i, tid in enumerate(runs.trial_ids):
        rows = np.flatnonzero(ids_arr == tid)
        order = rows[np.argsort(step[rows], kind="stable")]
        per.setdefault((int(runs.batch_size[i]), lr[tid]), []).append(
            measured_to_target(step[order], ex[order], val[order], target)
        )
    best: dict[int, tuple[float, float, float, int]] = {}
    for (b, lr_), xs in per.items():
        s, e = np.mean(xs, axis=0)
        if np.isfinite(s) and (b not in best or s < best[b][0]):
            best[b] = (float(s), float(e), lr_, len(xs))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("constants", help="the constant-batch sweep, analysed (bcrit analyze)")
    ap.add_argument("proposed", help="the sweep running the proposed schedule")
    args = ap.parse_args()
    with open(os.path.join(args.constants, "analysis", "bcrit.json")) as f:
        result = json.load(f)
    with open(os.path.join(args.proposed, "sweep_spec.yaml")) as f:
        spec = yaml.safe_load(f)
    segs, notes = segments_of(result)
    sizes = sorted({int(p["batch_size"]) for t in result["targets"] for p in t["points"]})
    prop = propose(segs, sizes)
    target = segs[-1].lo
    fixed = {k: v for k, v in spec["fixed"].items() if k in ("dim", "h_decay", "noise_scale", "theta0")}
    h, c, theta0 = QuadraticConfig(**fixed).problem()
    m0 = theta0**2

    b0 = spec["scientific"]["batch_sizes"][0]
    stages = BatchStages.from_schedule(b0, spec["fixed"]["batch_schedule"], 1)
    sched = best_measured(args.proposed, target)[b0]
    const = best_measured(args.constants, target)
    rule = spec["fixed"].get("schedule_lr_rule", "linear")
    stage_lrs = [stages.lr(s, sched[2], rule) for s in stages.starts]
    exact_sched = expected_to_target_staged(h, c, m0, stages, stage_lrs, target, 100_000)
    ref_b = prop.reference.sizes[0]
    proposed, _lrs = prop.schedule.stages(tuned_lrs(result, segs))
    if (proposed.starts, proposed.sizes) != (stages.starts, stages.sizes):
        print(f"note: the proposed sweep runs {b0} {stages.to_list()}, not this proposal's {proposed.sizes[0]} "
              f"{proposed.to_list()}: its 'pred' columns are the proposal's")  # fmt: skip
    print(f"target {target:.4g}; schedule: batch_size {b0}, lr {sched[2]:g}, batch_schedule {stages.to_list()}")
    print(f"proposal's own plan: sizes per segment {prop.schedule.sizes}; reference constant {ref_b}")
    print(f"{'plan':>14} | {'pred steps':>10} {'pred ex':>9} | {'meas steps':>10} {'meas ex':>9} {'seeds':>5} | "
          f"{'exact steps':>11} {'exact ex':>9}")  # fmt: skip
    rows = {"schedule": (prop.schedule, sched, exact_sched)}
    for p in prop.constants:
        b = p.sizes[0]
        if b in const:
            exact = expected_to_target_staged(h, c, m0, BatchStages((0,), (b,)), [const[b][2]], target, 100_000)
            rows[f"constant {b}"] = (p, const[b], exact)
    for name, (p, meas, exact) in rows.items():
        print(f"{name:>14} | {p.total_steps:10.4g} {p.total_examples:9.5g} | {meas[0]:10.4g} {meas[1]:9.5g} "
              f"{meas[3]:5d} | {exact[0]:11.4g} {exact[1]:9.5g}")  # fmt: skip
    ref = rows[f"constant {ref_b}"]
    for label, i in (("steps", 0), ("examples", 1)):
        pred = rows["schedule"][0].total_steps / ref[0].total_steps if i == 0 else (
            rows["schedule"][0].total_examples / ref[0].total_examples)  # fmt: skip
        meas = rows["schedule"][1][i] / ref[1][i]
        exact = rows["schedule"][2][i] / ref[2][i]
        print(f"schedule / constant {ref_b} {label}: predicted {pred:.3f}, measured {meas:.3f}, exact {exact:.3f}")
    for n in notes:
        print("note:", n)


if __name__ == "__main__":
    main()
