"""What ``compile: true`` costs before it pays: one trial per fresh process (eager; compiled with an empty inductor
cache; compiled again with that cache warm), on synthetic 32x32x4 latents in a packed store.

Prints, per variant: the training seconds of the first step (compilation of the training graph included), of the
remaining steps (the rate compile changes), both on the trials' step clock (``--clock``: wall, or CPU time of the
trial's process, which leaves out inductor's compile workers), and the process's whole wall time and CPU time
including its children. The break-even step count is the extra process wall time / the per-step saving.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_compile_cost.py --preset tiny --batch 64 --steps 21
    PYTHONPATH=. python3 benchmarks/bench_compile_cost.py --gpu --preset DiT-S/2 --batch 256 --steps 201   # a GPU

``--gpu``: the trials run on the CUDA device (``use_gpu``; the step clock is then CUDA events), for the cold
compile's cost against the compiled step's saving there, which decides ``compile``'s default (docs/trial.md). Without
CUDA it stops with one line (exit 2) before anything runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def one_trial(args) -> None:
    """The child: one trial, a report after step 1 and at the end; prints a JSON line."""
    from analysis.core import metrics as M
    from trainables import timing
    from trainables.config import TrialConfig
    from trainables.trial import run_local

    if args.clock == "cpu":
        timing.CLOCK = time.process_time

    cfg = TrialConfig(
        preset=args.preset, dataset=args.store, eval_size=16, batch_size=args.batch, micro_batch_size=args.batch,
        max_steps=args.steps, report_every=1, eval_every=args.steps, eval_repeats=1, gns=False, gns_every=0,
        threads_per_worker=1, lr=1e-4, compile=args.child == "compiled", use_gpu=args.gpu,
    )  # fmt: skip
    s = run_local(cfg)
    walls = [r[4] for rep in s.reports for r in rep["rows"] if r[2] == M.SYS_EXAMPLES_PER_S]
    print(json.dumps({"first_step_s": walls[0], "rest_s": walls[-1] - walls[0]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=21)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"], help="the trials' step clock")
    ap.add_argument("--gpu", action="store_true", help="run the trials on the CUDA device")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        one_trial(args)
        return
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print("bench_compile_cost: --gpu needs a CUDA device and none is visible; drop --gpu to measure on CPU",
                  file=sys.stderr)  # fmt: skip
            sys.exit(2)
    from benchmarks.bench_trial_input import make_folder
    from trainables.data.latent_store import pack

    with tempfile.TemporaryDirectory() as tmp:
        make_folder(os.path.join(tmp, "lat"), args.n)
        store = os.path.join(tmp, "store")
        pack(os.path.join(tmp, "lat"), store, progress=False)
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor-cache")}  # starts empty
        rows = {}
        variants = (("eager", "eager"), ("compiled, cold cache", "compiled"), ("compiled, warm cache", "compiled"))
        for name, kind in variants:
            cmd = [sys.executable, __file__, "--child", kind, "--store", store, "--preset", args.preset,
                   "--batch", str(args.batch), "--steps", str(args.steps), "--clock", args.clock]  # fmt: skip
            cmd += ["--gpu"] if args.gpu else []
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            rows[name] = {**json.loads(out.strip().splitlines()[-1]), "wall_s": wall, "cpu_s": cpu}
            print(name, rows[name], flush=True)
    eager = rows["eager"]
    per_step_eager = eager["rest_s"] / (args.steps - 1)
    where = "CUDA" if args.gpu else f"one thread, {args.clock} step clock"
    print(f"\n{args.preset}, batch {args.batch}, 32x32x4, {args.steps} steps, {where}:")
    for name, r in rows.items():
        per_step = r["rest_s"] / (args.steps - 1)
        line = (
            f"  {name:22s} first step {r['first_step_s']:7.2f} s  then {per_step * 1e3:7.1f} ms/step  "
            f"process {r['wall_s']:6.1f} s wall, {r['cpu_s']:6.1f} s CPU (with children)"
        )
        if name != "eager" and per_step < per_step_eager:
            extra = r["wall_s"] - eager["wall_s"]
            line += f"  break-even after ~{extra / (per_step_eager - per_step):.0f} steps"
        print(line)


if __name__ == "__main__":
    main()
