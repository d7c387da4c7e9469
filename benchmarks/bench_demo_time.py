"""Where the demo's time goes (issue 17): sweep start-up, per-trial set-up, training, evaluation, GNS, overhead,
analysis -- measured side by side in one run.

    .venv/bin/python benchmarks/bench_demo_time.py                      # examples/tiny.yaml
    .venv/bin/python benchmarks/bench_demo_time.py --spec examples/tiny.yaml --skip-sweep

1. The sweep itself, as `make demo` runs it (`bcrit sweep` into a fresh directory): wall of Ray's start-up and of
   `Tuner.fit`, then `bcrit analyze` (wall).
2. Every in-process trial of the spec again, in this process, one after the other, with timers around the
   trial's parts: set-up (model, data, held-out set: the trial's own ``startup_seconds``), optimizer steps
   (``TrainStep.__call__``), held-out evaluation (``HeldOutEval.__call__``) and per-bin GNS (``BinGNS.measure``).
   These are CPU-seconds of one core; the sweep runs two trials at a time on two cores.
3. The rest of the sweep's core-seconds (2 x fit wall minus the in-process parts) is what Ray Tune, Ray Train
   (the 2-worker trials' worker groups), the MLflow and Parquet writers and the trial actors cost.

Prints a table of seconds and shares; no timed asserts. Results: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextmanager
def timers(totals: dict[str, float]):
    """Wrap the trial's parts with timers adding to ``totals`` (restored on exit)."""
    from trainables import evaluation, gns_bins, step

    patched = [(step.TrainStep, "__call__", "training steps"), (evaluation.HeldOutEval, "__call__", "evaluation"),
               (gns_bins.BinGNS, "measure", "per-bin GNS")]  # fmt: skip
    originals = [getattr(cls, name) for cls, name, _ in patched]

    def timed(fn, key):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                totals[key] += time.perf_counter() - t

        return wrapper

    for (cls, name, key), fn in zip(patched, originals, strict=True):
        setattr(cls, name, timed(fn, key))
    try:
        yield
    finally:
        for (cls, name, _), fn in zip(patched, originals, strict=True):
            setattr(cls, name, fn)


def in_process_parts(spec_path: str) -> tuple[dict[str, float], int]:
    import torch

    from orchestrator.specs.sweep_spec import load_spec
    from trainables.config import TrialConfig
    from trainables.trial import run_local

    torch.set_num_threads(1)
    spec = load_spec(spec_path, [f"storage={tempfile.mkdtemp(prefix='bcrit-bench-')}"])
    configs = [c for c in spec.trial_configs() if int(c.get("num_workers", 0)) == 0]
    totals: dict[str, float] = defaultdict(float)
    with timers(totals):
        for c in configs:
            t = time.perf_counter()
            s = run_local(TrialConfig.from_dict(c))
            totals["trial total"] += time.perf_counter() - t
            totals["per-trial set-up"] += float(s.reports[-1].get("startup_seconds", 0.0))
    return dict(totals), len(configs)


def sweep_wall(spec_path: str) -> dict[str, float]:
    from orchestrator.specs.sweep_spec import load_spec
    from orchestrator.sweep import build_tuner, prepare, run

    out = tempfile.mkdtemp(prefix="bcrit-bench-")
    spec = load_spec(spec_path, [f"storage={out}"])
    t0 = time.perf_counter()
    configs = prepare(spec).configs  # as `bcrit sweep`: trials checked, then Ray
    t1 = time.perf_counter()
    run(build_tuner(spec, configs=configs), spec)
    t2 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "orchestrator.cli.main", "analyze", spec.sweep_dir]
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    t3 = time.perf_counter()
    return {"sweep start-up (Ray)": t1 - t0, "Tuner.fit": t2 - t1, "analysis": t3 - t2, "trials": spec.num_trials()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spec", default=os.path.join(ROOT, "examples", "tiny.yaml"))
    p.add_argument("--skip-sweep", action="store_true", help="only the in-process parts")
    args = p.parse_args()
    walls = {} if args.skip_sweep else sweep_wall(args.spec)
    parts, n = in_process_parts(args.spec)
    print(f"spec {args.spec}: {walls.get('trials', n)} trials ({n} in-process)")
    if walls:
        total = walls["sweep start-up (Ray)"] + walls["Tuner.fit"] + walls["analysis"]
        print(f"{'demo wall (sweep start-up + Tuner.fit + analysis)':58s} {total:8.1f} s")
        for k in ("sweep start-up (Ray)", "Tuner.fit", "analysis"):
            print(f"  {k:56s} {walls[k]:8.1f} s  {walls[k] / total:6.1%}")
    inner = {k: parts[k] for k in ("per-trial set-up", "training steps", "evaluation", "per-bin GNS")}
    other = parts["trial total"] - sum(inner.values())
    print(f"{'in-process trials, one core, one after the other':58s} {parts['trial total']:8.1f} core-s")
    for k, v in [*inner.items(), ("other in-loop (EMA, reports, checkpoints, rows)", other)]:
        print(f"  {k:56s} {v:8.1f} core-s  {v / parts['trial total']:6.1%}")
    if walls:
        rest = 2 * walls["Tuner.fit"] - parts["trial total"]
        print(f"{'Tuner.fit x 2 cores - in-process trials (Tune, Train, MLflow)':58s} {rest:8.1f} core-s  "
              f"{rest / (2 * walls['Tuner.fit']):6.1%} of the fit's core-seconds")  # fmt: skip


if __name__ == "__main__":
    main()
