"""The adaptive sweep on the tiny DiT, replayed from recorded trials: many repeats, the trajectory, and a bound.

A tiny-DiT trial is a deterministic function of its (batch size, lr, seed) on the CPU (checked here: every trial the
live adaptive sweep ``runs/adaptive-tiny`` ran has the same steps and examples as the grid's trial of the same
setting), so a sweep of any subset of the settings is what recorded trials of those settings measured. Given sweep
directories that together hold every setting of ``examples/adaptive-tiny.yaml``'s space for some seeds (the demo's
grid ``examples/tiny.yaml`` at seeds 0-2, 3-5, 6-8, plus the settings outside its per-batch-size lr grid), each
repeat takes three seeds and:

- **grid**: the 60 trials of ``examples/tiny.yaml``'s grid at those seeds (its two split trials left out, so the
  grid's examples are 2-3% below a real grid's: the ratios below are a little against the adaptive sweep);
- **adaptive**: ``analysis.decisions.next_trials`` as the Tune searcher calls it (``--concurrency`` trials in flight,
  each taking its recorded training seconds, a refit whenever one finishes; goal at the demo's two targets where
  the grid trusts them, ``min_seeds`` 2, the refits' resamples the searcher's), the chosen trials revealed from the
  recordings with their seeds relabelled 0-2. A goal met on the finished trials with others still running waits
  for them (``goal.running: wait``, the default), no new trial starting, and counts them in; ``--end-running``
  (``goal.running: end``): the sweep stops and they are ended, each counted with the examples it had processed by
  then (its recorded examples times the fraction of its training seconds elapsed) and left out of the answer;
- **oracle**: a design that knows every batch size's best lr at each goal target beforehand (from the whole grid):
  3 seeds at each and 1 at the grid neighbours of their range (the least a design needs to bracket the best lr and
  measure the seed noise at it);
- ``--no-hold``: the rule keeps choosing trials while the running ones are expected to meet the goal
  (``next_trials(hold=False)``); the sweep's clock (recorded training seconds, trials in flight overlapping) shows
  what holding costs in wall-clock time;
- ``--max-seeds K`` (K > 3): the adaptive sweep may run up to K seeds per setting (the triplet's three, then
  ``K - 3`` other recorded seeds); the grid keeps its 3;
- **hindsight** (``--hindsight``): the cheapest design of the oracle's family (each batch size left out or with 2
  or 3 seeds at its best lr(s), 1 at their neighbours) that the goal accepts at the grid's width, found by trying
  them cheapest first on the same recordings: picked partly for its luck, so below what a rule fixed beforehand
  can expect.

Every answer is ``bcrit analyze``'s (``analyze_metric``, 1000 resamples, calibrated, seed 0). The goal ``rel_ci``
is the grid's own widest relative half-width at its trusted targets of the two (``--rel-ci`` overrides it; a
repeat whose grid trusts neither is skipped), so "the goal met" is
"the grid's width reached". Printed per repeat: examples / grid's at the stop and at the first prefix whose answer is
at most the grid's width at both targets without flags (re-analysed with 1000 resamples), the widths, the stop.

Run (the recordings: benchmarks/RESULTS.md, "replayed"):
    PYTHONPATH=. .venv/bin/python benchmarks/bench_adaptive_tiny_replay.py --dirs GRID0 GRID1 GRID2 FILL \
        --triplets 0,1,2 3,4,5 6,7,8 --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.core import metrics as m
from analysis.decisions import next_trials as nt
from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import load_sweep_dir, runs_from_tables

TARGETS = (0.2097, 0.1802)
BATCH_SIZES = (8, 16, 32, 64, 128)
LRS = (2.5e-3, 5e-3, 1e-2, 2e-2, 4e-2)
GRID_LRS = {8: LRS[:4], 16: LRS[:4], 32: LRS[1:], 64: LRS[1:], 128: LRS[1:]}  # examples/tiny.yaml's grid


class Pool:
    """Every recorded main-split trial, by (batch size, lr, seed)."""

    def __init__(self, dirs: list[str]):
        cols = None
        trials, metrics = [], []
        for d in dirs:
            r = load_sweep_dir(d)
            t = r.trials
            keep = pc.and_(pc.equal(t.column("grad_accum"), 1), pc.less_equal(t.column("num_workers"), 1))
            keep = pc.and_(keep, pc.equal(t.column("micro_batch_size"), t.column("batch_size")))
            t = t.filter(keep)
            cols = [c for c in t.column_names if cols is None or c in cols]
            trials.append(t)
            ids = pc.cast(t.column("trial_id"), pa.string())
            mt = r.metrics.filter(pc.is_in(pc.cast(r.metrics.column("trial_id"), pa.string()), ids))
            metrics.append(mt.cast(metrics[0].schema) if metrics else mt)
        trials = [t.select(cols) for t in trials]
        self.trials = pa.concat_tables([_plain(t) for t in trials])
        self.metrics = pa.concat_tables([_plain(t) for t in metrics])
        ids = self.trials.column("trial_id").to_pylist()
        if len(set(ids)) != len(ids):
            raise SystemExit("trial ids repeat across the directories")
        lr = self.trials.column("lr").to_numpy()
        seed = self.trials.column("seed").to_numpy()
        bs = self.trials.column("batch_size").to_numpy()
        self.seconds = dict(zip(ids, self.trials.column("train_seconds").to_pylist(), strict=True))
        self.index: dict[tuple[int, float, int], str] = {}
        for b, x, s, t in zip(bs, lr, seed, ids, strict=True):
            key = (int(b), _lr(x), int(s))
            if key in self.index:
                raise SystemExit(f"setting {key} recorded twice")
            self.index[key] = t

    def has(self, seeds: tuple[int, ...]) -> bool:
        return all((b, _lr(x), s) in self.index for b in BATCH_SIZES for x in LRS for s in seeds)

    def reveal(self, keys: list[tuple[int, float, int]], seeds: tuple[int, ...]):
        """The trials of ``keys`` (seeds as the rule numbers them, 0..2) as ``Runs``, their seeds relabelled."""
        ids = [self.index[(b, _lr(x), seeds[s])] for b, x, s in keys]
        label = dict(zip(ids, [k[2] for k in keys], strict=True))
        keep = pa.array(ids)
        t = self.trials.filter(pc.is_in(self.trials.column("trial_id"), keep))
        i = t.schema.get_field_index("seed")
        t = t.set_column(i, t.schema.field(i), pa.array([label[x] for x in t.column("trial_id").to_pylist()],
                                                         pa.int64()))  # fmt: skip
        mt = self.metrics.filter(pc.is_in(self.metrics.column("trial_id"), keep))
        return runs_from_tables(t, mt, source="tiny-DiT recordings (replayed)")


def _plain(t: pa.Table) -> pa.Table:
    """Dictionary-encoded columns as plain strings (tables of several sweeps concatenate)."""
    for i, f in enumerate(t.schema):
        if pa.types.is_dictionary(f.type):
            t = t.set_column(i, f.name, pc.cast(t.column(i), pa.string()))
    return t


def _lr(x: float) -> float:
    return round(float(x), 12)


def examples(runs) -> float:
    return float(np.nansum(runs.trials.column("examples").to_numpy(zero_copy_only=False)))


def answer(runs, targets=TARGETS) -> dict:
    """``bcrit analyze``'s answer at ``targets``: per target B_crit, interval, relative half-width, flags and the
    fewest seeds at a fitted point."""
    fits = analyze_metric(runs, m.EVAL_LOSS, list(targets), bootstrap=1000, seed=0, strict=False, notes=[])
    out = {}
    for f in fits:
        out[f["target"]] = {"b_crit": f["b_crit"], "ci": list(f["b_crit_ci"]), "width": nt.rel_width(f),
                            "flags": f["flags"], "min_seeds": min(p["seeds"] for p in f["points"]),
                            "best_lr": {p["batch_size"]: p["lr"] for p in f["points"]}}  # fmt: skip
    return out


def worst(ans: dict, targets, min_seeds: int = 1) -> float:
    """The widest relative half-width at ``targets`` (inf: a target without an answer, flagged, or with fewer than
    ``min_seeds`` seeds at a point: what the goal would not accept)."""
    if any(y not in ans or ans[y]["flags"] or ans[y]["min_seeds"] < min_seeds for y in targets):
        return float("inf")
    return max(ans[y]["width"] for y in targets)


def grid_keys() -> list[tuple[int, float, int]]:
    return [(b, x, s) for b in BATCH_SIZES for x in GRID_LRS[b] for s in range(3)]


def family_keys(g_ans: dict, targets, b: int, k: int) -> list[tuple[int, float, int]]:
    """At batch size b: ``k`` seeds at its best grid lr at each goal target (from the whole grid), 1 at the grid
    neighbours of the range they span (the oracle's design with k = 3; the hindsight family's with k = 2 or 3)."""
    lrs = list(GRID_LRS[b])
    best = sorted({lrs.index(g_ans[y]["best_lr"][b]) for y in targets})
    keys = [(b, lrs[i], s) for i in best for s in range(k)]
    return keys + [(b, lrs[j], 0) for j in (best[0] - 1, best[-1] + 1) if 0 <= j < len(lrs)]


def oracle_keys(g_ans: dict, targets) -> list[tuple[int, float, int]]:
    return [key for b in BATCH_SIZES for key in family_keys(g_ans, targets, b, 3)]


def cheapest_design(pool: Pool, seeds, g_ans: dict, targets, width: float) -> dict | None:
    """In hindsight, the cheapest of the oracle's family the goal accepts at the grid's width: per batch size left
    out, or 2 or 3 seeds at its best lr(s) (from the whole grid) and 1 at the grid neighbours of their range; at
    least 3 batch sizes (3^5 designs, each analysed as the others). A design picked among many on the same
    recordings is picked partly for its luck, so this is below what any rule fixed beforehand could expect."""
    per_b = {b: {k: family_keys(g_ans, targets, b, k) for k in (2, 3)} for b in BATCH_SIZES}
    cost = {key: examples(pool.reveal([key], seeds)) for b in BATCH_SIZES for key in per_b[b][3]}
    found = None
    designs = sorted(itertools.product((0, 2, 3), repeat=len(BATCH_SIZES)),
                     key=lambda d: sum(cost[k] for b, x in zip(BATCH_SIZES, d, strict=True) if x
                                       for k in per_b[b][x]))  # fmt: skip
    for d in designs:
        if sum(1 for x in d if x) < 3:
            continue
        keys = [k for b, x in zip(BATCH_SIZES, d, strict=True) if x for k in per_b[b][x]]
        runs = pool.reveal(keys, seeds)
        ans = answer(runs, targets)
        if worst(ans, targets, min_seeds=2) <= width:  # the cheapest first: the first accepted is the cheapest
            found = {"design": dict(zip(BATCH_SIZES, d, strict=True)), "trials": len(keys),
                     "examples": examples(runs), "widths": [ans[y]["width"] for y in targets]}  # fmt: skip
            break
    return found


def replay(pool: Pool, seeds, targets, rel_ci: float, trials_budget: int, concurrency: int,
           end_pending: bool = False, hold: bool = True) -> dict:  # fmt: skip
    """One adaptive sweep on a clock: each trial runs its recorded training seconds (up to ``len(seeds)`` seeds
    per setting); when one finishes the rule refits and fills the free places. At a stop on the goal with
    ``end_pending`` the trials still running are ended: ``ended_examples`` is what they had processed."""
    space = nt.Space(BATCH_SIZES, LRS, max_seeds=len(seeds))
    goal = nt.Goal(tuple(targets), rel_ci)
    budget = nt.Budget(trials=trials_budget)
    done: list[tuple[int, float, int]] = []
    flight: list[tuple[float, float, nt.Trial]] = []  # (finishes at, started at, trial)
    steps, now = [], 0.0
    while True:
        runs = pool.reveal(done, seeds) if done else None
        dec = nt.next_trials(runs, space, goal, budget, pending=[f[2] for f in flight], n=concurrency - len(flight),
                             seed=0, end_pending=end_pending, hold=hold)  # fmt: skip
        for c in dec.choices:
            t = c.trial
            flight.append((now + pool.seconds[pool.index[(t.batch_size, _lr(t.lr), seeds[t.seed])]], now, t))
        if done:
            steps.append({"trials": len(done), "examples": dec.examples_spent, "widths": list(dec.widths.values()),
                          "chose": [f"{c.kind} B={c.trial.batch_size} lr={c.trial.lr:g} s={c.trial.seed}"
                                    for c in dec.choices]})  # fmt: skip
        if dec.stop is not None or not flight:
            running = [(t.batch_size, t.lr, t.seed) for _, _, t in flight]
            if dec.stop == nt.GOAL_MET and end_pending:  # ended part-way: their examples so far, not in the answer
                part = sum(examples(pool.reveal([k], seeds)) * (now - s0) / (f - s0)
                           for k, (f, s0, _) in zip(running, flight, strict=True))  # fmt: skip
                return {"stop": dec.stop, "keys": done, "steps": steps, "ended": running, "ended_examples": part,
                        "clock": now}  # fmt: skip
            # the trials still running finish (budget, exhausted; or waiting for them): counted in
            return {"stop": dec.stop or nt.EXHAUSTED, "keys": done + running, "steps": steps, "ended": [],
                    "ended_examples": 0.0, "clock": max([now] + [f for f, _, _ in flight])}  # fmt: skip
        flight.sort(key=lambda f: f[0])
        now, _, t = flight.pop(0)
        done.append((t.batch_size, t.lr, t.seed))


def first_reach(pool: Pool, seeds, keys, targets, width: float, start: int) -> dict | None:
    """The first prefix of the replayed trials (from ``start`` trials on) whose answer the goal would accept at the
    grid's width: within it at every goal target, no flags, >= 2 seeds at every point."""
    for k in range(start, len(keys) + 1):
        runs = pool.reveal(keys[:k], seeds)
        ans = answer(runs, targets)
        if worst(ans, targets, min_seeds=2) <= width:
            return {"trials": k, "examples": examples(runs), "widths": [ans[y]["width"] for y in targets]}
    return None


def one(pool: Pool, seeds, concurrency: int, rel_ci: float | None, trials_budget: int, hindsight: bool,
        extra: tuple[int, ...] = (), end_pending: bool = False, hold: bool = True) -> dict:  # fmt: skip
    """Grid, oracle and adaptive sweep at one seed triplet; the goal targets are the grid's trusted ones of the two.
    ``extra``: further recorded seeds the adaptive sweep may run (its ``max_seeds`` is 3 + their number)."""
    t0 = time.time()
    grid = pool.reveal(grid_keys(), seeds)
    g_ans, g_ex = answer(grid), examples(grid)
    targets = [y for y in TARGETS if y in g_ans and not g_ans[y]["flags"]]
    out = {"seeds": list(seeds), "targets": targets, "grid": {"trials": len(grid.trial_ids), "examples": g_ex,
                                                              "answer": g_ans}}  # fmt: skip
    if not targets:
        return out | {"skipped": "the grid has no trusted target of the two"}
    g_w = worst(g_ans, targets)
    goal = rel_ci if rel_ci is not None else g_w
    orc = pool.reveal(oracle_keys(g_ans, targets), seeds)
    a_seeds = tuple(seeds) + tuple(extra)
    rep = replay(pool, a_seeds, targets, goal, trials_budget, concurrency, end_pending, hold)
    a_runs = pool.reveal(rep["keys"], a_seeds)
    # the first prefix the goal would accept at the grid's width: scanned from where the refits' widths near it
    near = [s["trials"] for s in rep["steps"] if max(s["widths"]) <= 1.5 * g_w]
    reach = first_reach(pool, a_seeds, rep["keys"], targets, g_w, near[0]) if near else None
    best = cheapest_design(pool, seeds, g_ans, targets, g_w) if hindsight else None
    return out | {
        "adaptive_seeds": list(a_seeds),
        "hindsight": None if best is None else {**best, "examples": best["examples"] / g_ex},
        "goal_rel_ci": goal, "stop": rep["stop"],
        "oracle": {"trials": len(orc.trial_ids), "examples": examples(orc) / g_ex, "answer": answer(orc, targets)},
        "adaptive": {"trials": len(rep["keys"]) + len(rep["ended"]), "ended": len(rep["ended"]),
                     "examples": (examples(a_runs) + rep["ended_examples"]) / g_ex, "answer": answer(a_runs, targets),
                     "clock": rep["clock"]},
        "reach": None if reach is None else {**reach, "examples": reach["examples"] / g_ex},
        "steps": rep["steps"], "seconds": time.time() - t0,
    }  # fmt: skip


def _fmt(ans: dict) -> str:
    return "; ".join(
        f"{y:g}: {a['b_crit']:.1f} +-{a['width']:.2f}" + (f" ({','.join(a['flags'])})" if a["flags"] else "")
        for y, a in ans.items()
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dirs", nargs="+", required=True, help="sweep directories holding the recorded trials")
    ap.add_argument("--triplets", nargs="*", default=None, help="seed triplets like 0,1,2 (default: every 3 of the "
                    "recorded seeds, up to --max-repeats, in a fixed random order)")  # fmt: skip
    ap.add_argument("--max-repeats", type=int, default=12)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rel-ci", type=float, default=None)
    ap.add_argument("--trials", type=int, default=62, help="the adaptive sweep's trial budget (the grid: 62)")
    ap.add_argument("--max-seeds", type=int, default=3, help="seeds per setting the adaptive sweep may run (the "
                    "grid: 3; more are drawn from the recorded seeds outside the triplet)")  # fmt: skip
    ap.add_argument("--end-running", action="store_true", help="goal.running: end (end the trials running at a "
                    "goal met) instead of waiting for them")  # fmt: skip
    ap.add_argument("--no-hold", action="store_true", help="keep choosing trials while the running ones are expected "
                    "to meet the goal (next_trials(hold=False): the rule before 2026-11-27)")  # fmt: skip
    ap.add_argument("--hindsight", action="store_true", help="also the cheapest accepted design in hindsight (slow)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    pool = Pool(a.dirs)
    seeds_all = sorted({k[2] for k in pool.index})
    if a.triplets:
        triplets = [tuple(int(x) for x in t.split(",")) for t in a.triplets]
    else:
        every = [t for t in itertools.combinations(seeds_all, 3) if pool.has(t)]
        order = np.random.default_rng(0).permutation(len(every))
        triplets = [every[i] for i in order[: a.max_repeats]]
    results = []
    for seeds in triplets:
        if not pool.has(seeds):
            raise SystemExit(f"seeds {seeds}: not every setting of the space is recorded")
        rest = [s for s in seeds_all if s not in seeds]
        rest = [rest[i] for i in np.random.default_rng(list(seeds)).permutation(len(rest))]
        extra = tuple(s for s in rest if pool.has((s,)))[: max(a.max_seeds - 3, 0)]
        if len(extra) < a.max_seeds - 3:
            raise SystemExit(f"--max-seeds {a.max_seeds}: only {3 + len(extra)} recorded seeds for {seeds}")
        r = one(pool, seeds, a.concurrency, a.rel_ci, a.trials, a.hindsight, extra, a.end_running, not a.no_hold)
        results.append(r)
        if "skipped" in r:
            print(f"seeds {seeds}: skipped, {r['skipped']}: {_fmt(r['grid']['answer'])}", flush=True)
            continue
        reach = r["reach"]
        print(
            f"seeds {seeds}: grid {_fmt(r['grid']['answer'])} | oracle {r['oracle']['examples']:.2f} "
            f"{_fmt(r['oracle']['answer'])} | adaptive {r['stop']} {r['adaptive']['trials']} trials "
            f"({r['adaptive']['ended']} ended) "
            f"{r['adaptive']['examples']:.2f} {_fmt(r['adaptive']['answer'])} | grid width accepted at "
            + ("never" if reach is None else f"{reach['examples']:.2f} ({reach['trials']} trials)")
            + (
                ""
                if r["hindsight"] is None
                else f" | hindsight {r['hindsight']['examples']:.2f} {r['hindsight']['design']}"
            )
            + f" [{r['seconds']:.0f} s]",
            flush=True,
        )
    results_all, results = results, [r for r in results if "skipped" not in r]
    ex = [r["adaptive"]["examples"] for r in results]
    rc = [r["reach"]["examples"] for r in results if r["reach"]]
    orc = [r["oracle"]["examples"] for r in results]
    skipped = len(results_all) - len(results)
    print(f"\n{len(results)} repeats ({skipped} skipped): adaptive at its stop, examples / grid median "
          f"{np.median(ex):.2f} (range {min(ex):.2f}-{max(ex):.2f}); the grid's width first accepted in {len(rc)} "
          f"of {len(results)}, median {np.median(rc) if rc else float('nan'):.2f}; "
          f"oracle {np.median(orc):.2f}; sweep clock (recorded training seconds, {a.concurrency} at once) median "
          f"{np.median([r['adaptive']['clock'] for r in results]):.0f} s")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results_all}, f, indent=1, default=float)


if __name__ == "__main__":
    main()
