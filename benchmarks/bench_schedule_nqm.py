"""A proposed batch-size schedule against constant batch sizes on the noisy quadratic model: predicted (from the
sweep's fits, analysis.decisions.schedule), measured (the trials' own steps and ``examples`` column at the target) and
exact
(the NQM closed form of tests.oracles.nqm / tests.oracles.nqm_schedule), side by side.

    bcrit sweep examples/schedule-quadratic.yaml
    bcrit analyze runs/schedule-quadratic --targets 9.27,3.09,0.927,0.309
    bcrit schedule runs/schedule-quadratic
    bcrit sweep examples/schedule-quadratic.yaml --set name=schedule-quadratic-proposed \\
        --set storage=./runs/schedule-quadratic-proposed --set scientific.batch_sizes=[B0] \\
        --set 'fixed.batch_schedule=<the proposal>'
    python benchmarks/bench_schedule_nqm.py runs/schedule-quadratic runs/schedule-quadratic-proposed

On another workload (the DiT) the exact columns are ``nan``; ``--plan 16,16,...,64`` predicts a plan other than
the proposal (a point of ``analysis.decisions.schedule.pareto_front``). Measured: per setting (batch size or schedule,
lr)
the mean over seeds of the steps and examples to the last segment's target (interpolated in the rows,
analysis.decisions.schedule.measured_to_target), then the setting with the fewest mean steps. The schedule is read from
the
second sweep's spec (``fixed.batch_schedule``), its stage-0 lr is its best one.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pyarrow.compute as pc
import yaml

from analysis.core import metrics as M
from analysis.core.stages import BatchStages
from analysis.decisions.schedule import measured_to_target, plan, propose, segments_of
from analysis.sources.loaders import load_sweep_dir
from orchestrator.cli.schedule_plan import tuned_lrs
from tests.oracles.nqm_schedule import expected_to_target_staged
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


def exact_fn(spec: dict, target: float):
    """``(stages, lrs) -> (steps, examples)`` of the NQM's expected loss; None for another workload."""
    if spec.get("workload") != "quadratic":
        return None
    fixed = {k: v for k, v in spec["fixed"].items() if k in ("dim", "h_decay", "noise_scale", "theta0")}
    h, c, theta0 = QuadraticConfig(**fixed).problem()
    return lambda stages, lrs: expected_to_target_staged(h, c, theta0**2, stages, lrs, target, 100_000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("constants", help="the constant-batch sweep, analysed (bcrit analyze)")
    ap.add_argument("proposed", help="the sweep running the schedule (fixed.batch_schedule, one batch size)")
    ap.add_argument("--plan", help="batch size per segment the schedule realises (default: the proposal's)")
    args = ap.parse_args()
    with open(os.path.join(args.constants, "analysis", "bcrit.json")) as f:
        result = json.load(f)
    with open(os.path.join(args.proposed, "sweep_spec.yaml")) as f:
        spec = yaml.safe_load(f)
    segs, notes = segments_of(result)
    prop = propose(segs, sorted({int(p["batch_size"]) for t in result["targets"] for p in t["points"]}))
    chosen = plan(segs, [int(b) for b in args.plan.split(",")]) if args.plan else prop.schedule
    target, exact = segs[-1].lo, exact_fn(spec, segs[-1].lo)
    b0 = spec["scientific"]["batch_sizes"][0]
    stages = BatchStages.from_schedule(b0, spec["fixed"]["batch_schedule"], 1)
    sched, const = best_measured(args.proposed, target)[b0], best_measured(args.constants, target)
    rule = spec["fixed"].get("schedule_lr_rule", "linear" if exact else "sqrt")
    planned, _lrs = chosen.stages(tuned_lrs(result, segs))
    if (planned.starts, planned.sizes) != (stages.starts, stages.sizes):
        print(f"note: the sweep runs {b0} {stages.to_list()}, the plan is {planned.sizes[0]} {planned.to_list()}")
    print(f"target {target:.4g}; schedule: batch_size {b0}, lr {sched[2]:g}, batch_schedule {stages.to_list()}")
    print(
        f"plan: sizes per segment {chosen.sizes}; proposal {prop.schedule.sizes}; reference {prop.reference.sizes[0]}"
    )
    nan = (float("nan"), float("nan"))
    rows = {
        "schedule": (
            chosen,
            sched,
            exact(stages, [stages.lr(s, sched[2], rule) for s in stages.starts]) if exact else nan,
        )
    }
    for p in prop.constants:
        b = p.sizes[0]
        if b in const:
            rows[f"constant {b}"] = (p, const[b], exact(BatchStages((0,), (b,)), [const[b][2]]) if exact else nan)
    report(rows, prop.reference.sizes[0])
    for n in notes:
        print("note:", n)


def report(rows: dict, ref_b: int) -> None:
    print(f"{'plan':>14} | {'pred steps':>10} {'pred ex':>9} | {'meas steps':>10} {'meas ex':>9} {'seeds':>5} | "
          f"{'exact steps':>11} {'exact ex':>9}")  # fmt: skip
    for name, (p, meas, ex) in rows.items():
        print(f"{name:>14} | {p.total_steps:10.4g} {p.total_examples:9.5g} | {meas[0]:10.4g} {meas[1]:9.5g} "
              f"{meas[3]:5d} | {ex[0]:11.4g} {ex[1]:9.5g}")  # fmt: skip
    ref, sch = rows[f"constant {ref_b}"], rows["schedule"]
    for other in sorted({ref_b, *(int(n.split()[1]) for n in rows if n != "schedule")}):
        o = rows[f"constant {other}"]
        pred = (sch[0].total_steps / o[0].total_steps, sch[0].total_examples / o[0].total_examples)
        meas = (sch[1][0] / o[1][0], sch[1][1] / o[1][1])
        ex = (sch[2][0] / o[2][0], sch[2][1] / o[2][1])
        mark = " (reference)" if o is ref else ""
        print(
            f"schedule / constant {other}{mark}: steps predicted {pred[0]:.3f}, measured {meas[0]:.3f}, exact "
            f"{ex[0]:.3f}; examples predicted {pred[1]:.3f}, measured {meas[1]:.3f}, exact {ex[1]:.3f}"
        )


if __name__ == "__main__":
    main()
