"""A critical-batch-size study on one GPU where Ray and MLflow are not installed (the lent device's image), several
trials at once: ``--workers`` spawned worker processes each run trials one after another through the trial's own
code path, `trainables.loop.train_loop` with the in-process `trainables.trial.LocalSession` (what `run_local` and an
in-process `run_trial` run), so that their kernels overlap on the one GPU. Each trial's rows go into a sweep
directory through orchestrator.records.runs_tables (the files `bcrit sweep` writes), compacted after every trial, so
that ``bcrit analyze DIR --no-mlflow`` reads it like any sweep. What differs from `bcrit sweep`: no Tune scheduling,
no MLflow run, no checkpoints kept. ``--workers 0`` runs the trials in this process, one after another.

The data are synthetic, learnable latents at fast-DiT's shape (4x32x32, ``--n`` of them, ``--classes`` classes):
each example is its class's smooth mean field plus ``--rank`` smooth fields with N(0, 1) weights plus 5% white
noise, scaled to unit variance. Smooth fields are 4x8x8 Gaussian draws upsampled to 32x32. The denoising loss has
structure to learn at every timestep, unlike white-noise latents. They are packed (`bcrit pack-latents`'s store).

Grid: ``--batch-sizes`` x ``--lr-mults`` x ``--seeds``. A trial at batch size B trains at lr ``--lr`` x sqrt(B / 256) x
its multiplier for ``max(--min-steps, round(--steps x sqrt(256 / B)))`` steps, evaluates every ``steps // --evals``
steps (``--eval-size`` held-out latents x ``--eval-repeats`` draws), warms up for min(50, steps // 10) steps, and
stops at ``--target-loss`` or its step budget; GNS at the config's defaults (``--gns-every`` overrides the per-bin
cadence). Trials are ordered seed-major, and within a seed the longest first (most steps; small batch sizes), so
that a cut leaves whole seeds and the workers finish together.

Time: ``--budget-s``: start no trial after this many seconds; ``--deadline-s``: a trial still running then ends at
its next evaluation and is recorded as ``budget_spent`` (censored there, as a smaller ``max_steps`` would have it;
the log line and study.json say ``cut at the deadline``); a worker not back ``--grace-s`` later is killed and its
trial left out. A trial that fails is recorded as ``failed`` (analyze leaves it out) with its error; when the first
``--workers`` trials all fail, no more are started.

    PYTHONPATH=. python3 benchmarks/gpu_study.py --out /tmp/gpu-study --device cuda --deadline-s 200
    PYTHONPATH=. .venv/bin/python benchmarks/gpu_study.py --out /tmp/s --device cpu --preset tiny \
        --batch-sizes 4 8 16 --lr 4e-3 --steps 8 --seeds 0 --n 384 --eval-size 64 --workers 2
    .venv/bin/bcrit analyze /tmp/gpu-study --no-mlflow
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
import traceback

import numpy as np

from analysis.core import metrics as M
from orchestrator.records.runs_tables import RunsTables, trial_row
from trainables.config import ConfigError, TrialConfig

REF_BATCH = 256  # the batch size --lr and --steps refer to (sqrt-scaled to the others)
CUT = "cut at the deadline"


def smooth(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` smooth 4x32x32 fields: 4x8x8 standard-normal draws, each value repeated over a 4x4 patch."""
    return np.repeat(np.repeat(rng.standard_normal((n, 4, 8, 8)), 4, axis=2), 4, axis=3)


def make_latents(root: str, n: int, classes: int, rank: int, seed: int = 0) -> None:
    """A fast-DiT latent folder of ``n`` examples (see the module docstring)."""
    rng = np.random.default_rng(seed)
    means, basis = smooth(rng, classes), smooth(rng, rank) / math.sqrt(rank)
    y = np.arange(n) % classes
    x = means[y] + np.einsum("nr,rchw->nchw", rng.standard_normal((n, rank)), basis)
    x += 0.05 * rng.standard_normal(x.shape)
    x = (x / x.std()).astype(np.float32)
    for d in ("imagenet256_features", "imagenet256_labels"):
        os.makedirs(os.path.join(root, d))
    for i in range(n):
        np.save(os.path.join(root, "imagenet256_features", f"{i}.npy"), x[i : i + 1])
        np.save(os.path.join(root, "imagenet256_labels", f"{i}.npy"), np.array([y[i]], np.int64))


# --- the plan -----------------------------------------------------------------------------------------------------
def trial_steps(args, b: int) -> int:
    return max(args.min_steps, round(args.steps * math.sqrt(REF_BATCH / b)))


def plan(args) -> list[dict]:
    """The trials in the order they start: ``{"tid", "b", "mult", "seed", "steps"}``, seed-major, within a seed the
    most steps first (the longest trials, on launch-bound small batches), learning rates in the given order."""
    jobs = []
    for seed in args.seeds:
        cell = [dict(tid=f"b{b}_lr{m:g}_s{seed}", b=b, mult=m, seed=seed, steps=trial_steps(args, b))
                for b in args.batch_sizes for m in args.lr_mults]  # fmt: skip
        jobs += sorted(cell, key=lambda j: -j["steps"])  # stable: batch sizes, then lrs, in the given order
    return jobs


def trial_config(args, job: dict, dataset: str) -> TrialConfig:
    steps, b = job["steps"], job["b"]
    extra = {} if args.gns_every is None else {"gns_every": args.gns_every}
    return TrialConfig(
        preset=args.preset, dataset=dataset, eval_size=args.eval_size, eval_repeats=args.eval_repeats,
        batch_size=b, micro_batch_size=b, max_steps=steps, eval_every=max(1, steps // args.evals),
        lr=args.lr * math.sqrt(b / REF_BATCH) * job["mult"], seed=job["seed"], warmup_steps=min(50, steps // 10),
        target_loss=args.target_loss, use_gpu=args.device == "cuda", threads_per_worker=1, compile=args.compile,
        **extra,
    )  # fmt: skip


# --- one trial (in a worker process, or here with --workers 0) ----------------------------------------------------
class Deadline:
    """The session's ``sweep_ended``: true from ``at`` (time.time()) on; TrialSkeleton asks it at each evaluation."""

    name = "study deadline"  # a reader with a name is asked (trainables.skeleton.TrialSkeleton.sweep_ended)

    def __init__(self, at: float | None):
        self.at = at

    def __call__(self) -> bool:
        return self.at is not None and time.time() >= self.at


def run_one(job: dict) -> dict:
    """Train one trial (``job["cfg"]``: a TrialConfig dict) with the in-process session; returns what the log shows,
    its ``trials.parquet`` row (``row``) and its metric rows (``rows``), which the study alone writes."""
    from trainables.loop import train_loop
    from trainables.trial import LocalSession

    cfg = TrialConfig.from_dict(job["cfg"])
    session = LocalSession(None, None, "cuda" if cfg.use_gpu else "cpu")
    session.sweep_ended = Deadline(job.get("deadline"))
    t0 = time.perf_counter()
    summary = train_loop(cfg, session)
    wall = time.perf_counter() - t0
    last = session.reports[-1]
    status, cut = last["status"], last["status"] == M.STATUS_ENDED
    if cut:  # ended by the study's deadline: its budget was the time left (censored at its last evaluation)
        status = M.STATUS_BUDGET_SPENT
    steps = int(summary[M.STEP])
    return {
        "tid": job["tid"], "status": status, "cut": cut, "steps": steps, "max_steps": cfg.max_steps,
        "lr": cfg.lr, "wall_s": wall, "train_s": summary["train_seconds"], "startup_s": summary["startup_seconds"],
        "step_ms": 1e3 * summary["train_seconds"] / max(1, steps), "eval_loss": last.get(M.EVAL_LOSS),
        "first_eval": session.reports[0].get(M.EVAL_LOSS), "examples": int(summary[M.EXAMPLES]),
        "gns_global": summary["gns_global"], "pid": os.getpid(),
        "row": trial_row(job["tid"], cfg.to_dict(), status, last),
        "rows": [r for rep in session.reports for r in rep["rows"]],
    }  # fmt: skip


def safe_run(job: dict) -> dict:
    try:
        return run_one(job)
    except Exception as e:  # one failed trial (a bug, out of memory) must not take the study down
        first = str(e).splitlines()[0] if str(e) else ""
        return {"tid": job["tid"], "error": f"{type(e).__name__}: {first}", "traceback": traceback.format_exc()}


def worker_main(tasks, results, use_gpu: bool) -> None:
    """A worker process: start CUDA once, then run the jobs it is given until ``None``."""
    t0 = time.perf_counter()
    import torch

    import trainables.loop  # noqa: F401 (diffusers and the model code, imported once per worker)

    if use_gpu:
        torch.zeros(1, device="cuda")  # the CUDA context, once per worker
    results.put(("ready", os.getpid(), time.perf_counter() - t0))
    while (job := tasks.get()) is not None:
        results.put(("start", os.getpid(), job["tid"]))
        results.put(("done", os.getpid(), safe_run(job)))


# --- the study ----------------------------------------------------------------------------------------------------
def log(msg: str) -> None:
    print(msg, flush=True)


def describe(res: dict, job: dict) -> str:
    if "error" in res:
        return f"{res['tid']}: FAILED {res['error']}"
    cut = f", {CUT}" if res["cut"] else ""
    return (
        f"{res['tid']}: {res['steps']}/{res['max_steps']} steps at lr {res['lr']:.3g}, B {job['b']}, "
        f"eval loss {res['first_eval']:.4f} -> {res['eval_loss']:.4f}, {res['status']}{cut}; "
        f"{res['wall_s']:.1f} s wall, {res['step_ms']:.0f} ms/step training, start-up {res['startup_s']:.1f} s "
        f"(pid {res['pid']})"
    )


class Pool:
    """``workers`` spawned processes taking one job at a time from a queue (0: each job runs here, at submit).
    ``free``: workers ready for a job; ``running``: tid -> job of the jobs handed out and not back."""

    def __init__(self, workers: int, use_gpu: bool):
        self.n, self.procs, self.inline = workers, [], []
        self.running: dict[str, dict] = {}
        self.on: dict[int, str] = {}  # worker pid -> the tid it runs
        self.free = 0 if workers else 1
        if workers:
            ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
            self.tasks, self.results = ctx.Queue(), ctx.Queue()
            # not daemonic: a compiled trial's inductor may start processes of its own
            self.procs = [ctx.Process(target=worker_main, args=(self.tasks, self.results, use_gpu))
                          for _ in range(workers)]  # fmt: skip
            for p in self.procs:
                p.start()

    def alive(self) -> bool:
        return not self.n or any(p.is_alive() for p in self.procs)

    def submit(self, job: dict) -> None:
        self.running[job["tid"]] = job
        self.free -= 1
        if self.n:
            self.tasks.put(job)
        else:
            self.inline.append(("done", os.getpid(), safe_run(job)))

    def get(self, timeout: float):
        """The next message ``("ready" | "done", pid, payload)``, or None after ``timeout``. A worker that died
        with a job gives that job back as a failure (its slot is gone)."""
        if not self.n:
            msg = self.inline.pop(0) if self.inline else None
        else:
            try:
                msg = self.results.get(timeout=timeout)
            except queue.Empty:
                dead = [p for p in self.procs if not p.is_alive() and p.pid in self.on]
                if not dead:
                    return None
                p = dead[0]
                tid = self.on.pop(p.pid)
                self.running.pop(tid, None)
                return ("done", p.pid, {"tid": tid, "error": f"worker {p.pid} died (exit code {p.exitcode})"})
        if msg is None:
            return None
        kind, pid, payload = msg
        if kind == "ready":
            self.free += 1
        elif kind == "start":
            self.on[pid] = payload
            return None
        else:
            self.running.pop(payload["tid"], None)
            self.on.pop(pid, None)
            self.free += 1
        return msg

    def close(self, kill: bool) -> None:
        """Ask the workers to finish (``kill``: kill them), then join them; a second call does nothing."""
        procs, self.procs = self.procs, []
        for p in procs:
            if kill:
                p.kill()
            else:
                self.tasks.put(None)
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def run(args) -> int:
    t_start = time.time()
    deadline = None if args.deadline_s is None else t_start + args.deadline_s
    jobs = plan(args)
    try:  # every trial's config, before any data or process
        for job in jobs:
            trial_config(args, job, "digits")
    except ConfigError as e:
        print(f"gpu_study: error: {e}", file=sys.stderr)
        return 2
    tables = RunsTables(args.out)
    pool = Pool(args.workers, args.device == "cuda")  # workers import torch and start CUDA while the data are made
    done: list[dict] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            from trainables.data.latent_store import pack
            from trainables.trial import check_trial

            folder, store = os.path.join(tmp, "lat"), os.path.join(tmp, "store")
            make_latents(folder, args.n, args.classes, args.rank)
            pack(folder, store, progress=False)
            log(f"data: {args.n} latents packed, {time.time() - t_start:.1f} s after the start")
            for job in jobs:
                cfg = trial_config(args, job, store)  # an automatic gns_window stays automatic (TrialConfig.replace)
                job.update(cfg={**cfg.to_dict(), "gns_window": cfg.gns_window}, deadline=deadline)
            try:
                check_trial(TrialConfig.from_dict(jobs[0]["cfg"]))
            except ConfigError as e:
                print(f"gpu_study: error: {e}", file=sys.stderr)
                return 2
            per_trial = ("batch_size", "micro_batch_size", "lr", "seed", "max_steps", "eval_every", "warmup_steps")
            base = {k: v for k, v in jobs[0]["cfg"].items() if k not in per_trial}
            log(f"every trial's config but {', '.join(per_trial)}: {json.dumps(base, sort_keys=True)}")
            for j in jobs:
                c = j["cfg"]
                log(f"  {j['tid']}: " + ", ".join(f"{k} {c[k]:.4g}" if k == "lr" else f"{k} {c[k]}" for k in per_trial))
            drive(args, jobs, tables, pool, done, t_start, deadline)
            pool.close(kill=False)
    finally:
        pool.close(kill=True)  # after an exception (a clean close above leaves nothing to kill)
    return summarize(args, jobs, done, time.time() - t_start)


def drive(args, jobs: list[dict], tables: RunsTables, pool: Pool, done: list, t_start: float, deadline) -> None:
    """Hand the jobs to the pool while time is left, write and compact each result as it comes back."""
    by_tid = {j["tid"]: j for j in jobs}
    pending, hard = list(jobs), None if deadline is None else deadline + args.grace_s
    while pending or pool.running:
        now = time.time()
        stop = ""
        if pending and now - t_start > args.budget_s:
            stop = f"the budget of {args.budget_s:g} s is spent"
        elif pending and deadline is not None and deadline - now < args.min_left_s:
            stop = f"less than {args.min_left_s:g} s are left before the deadline"
        elif pending and not pool.alive():
            stop = "no worker is alive"
        elif pending and len(done) >= max(1, args.workers) and all("error" in d for d in done):
            stop = f"the first {len(done)} trials failed"
        if stop:
            log(f"no more trials started: {stop}; not run: {' '.join(j['tid'] for j in pending)}")
            pending = []
            continue
        while pool.free > 0 and pending:
            pool.submit(pending.pop(0))
        if hard is not None and now > hard:
            log(f"{args.grace_s:g} s past the deadline: workers killed; left out: {' '.join(sorted(pool.running))}")
            pool.close(kill=True)
            return
        if pool.n and not pool.alive() and pool.running:
            log(f"every worker died; left out: {' '.join(sorted(pool.running))}")
            return
        msg = pool.get(timeout=1.0)
        if msg is None:
            continue
        kind, pid, payload = msg
        if kind == "ready":
            log(f"worker {pid} ready in {payload:.1f} s (imports, CUDA context)")
            continue
        job = by_tid[payload["tid"]]
        if "error" not in payload:  # one writer: a compaction never sees a trial's rows before its row
            tables.write_trial(payload.pop("row"))
            tables.add_rows(job["tid"], payload.pop("rows"))
        else:
            tables.write_trial(trial_row(job["tid"], job["cfg"], M.STATUS_FAILED))
            if "traceback" in payload and not any("error" in d for d in done):
                log(payload["traceback"].rstrip())  # the first failure's traceback, once
        done.append(payload)
        n = tables.compact()
        log(f"{describe(payload, job)}  [{len(done)}/{len(jobs)} done; tables {n[0]} trials, {n[1]} rows]")


def summarize(args, jobs: list[dict], done: list[dict], wall: float) -> int:
    """The study's closing lines and study.json; exit status 0 when a trial trained."""
    by_tid = {j["tid"]: j for j in jobs}
    ok = [d for d in done if "error" not in d]
    train = sum(d["train_s"] for d in ok)
    examples = sum(d["examples"] for d in ok)
    log(
        f"{len(ok)} of {len(jobs)} trials trained in {wall:.0f} s with {args.workers} worker(s) "
        f"({sum(d['cut'] for d in ok)} {CUT}, {len(done) - len(ok)} failed, {len(jobs) - len(done)} not run); "
        f"their training time {train:.0f} s = {train / wall:.2f} x the wall clock (concurrent trials overlap); "
        f"{examples / wall:.0f} examples/s over the study"
    )
    for b in args.batch_sizes:
        ms = [d["step_ms"] for d in ok if by_tid[d["tid"]]["b"] == b]
        if ms:
            log(f"  B {b}: median {np.median(ms):.0f} ms/step of training over {len(ms)} trial(s)")
    ran = {d["tid"] for d in done}
    trials = [{k: v for k, v in d.items() if k != "traceback"} for d in done]
    with open(os.path.join(args.out, "study.json"), "w") as f:
        not_run = [j["tid"] for j in jobs if j["tid"] not in ran]
        json.dump({"args": vars(args), "trials": trials, "not_run": not_run, "seconds": wall}, f, indent=1)
    return 0 if ok else 1


def target(text: str) -> float | None:
    return None if text.lower() in ("none", "off", "0") else float(text)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the sweep directory to write")
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--preset", default="DiT-S/2")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--lr", type=float, default=4e-4, help="learning rate at B = 256 (sqrt-scaled)")
    ap.add_argument("--lr-mults", type=float, nargs="+", default=[1.0, 2.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=80, help="steps at B = 256 (sqrt-scaled)")
    ap.add_argument("--min-steps", type=int, default=20)
    ap.add_argument("--evals", type=int, default=25, help="held-out evaluations per trial")
    ap.add_argument("--eval-size", type=int, default=512)
    ap.add_argument("--eval-repeats", type=int, default=2)
    ap.add_argument("--target-loss", type=target, default=0.12, help="stop a trial at this eval loss ('none': off)")
    ap.add_argument("--gns-every", type=int, default=None, help="per-bin GNS cadence (default: the config's)")
    ap.add_argument("--compile", action="store_true", help="torch.compile each trial's model (config compile: true)")
    ap.add_argument("--workers", type=int, default=4, help="worker processes, trials at once (0: in this process)")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no trial after this many seconds")
    ap.add_argument("--deadline-s", type=float, default=None, help="end running trials at this many seconds")
    ap.add_argument("--min-left-s", type=float, default=15.0, help="start no trial with less left to the deadline")
    ap.add_argument("--grace-s", type=float, default=30.0, help="kill the workers this long after the deadline")
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.workers < 0 or len(set(args.batch_sizes)) < 3:
        print("gpu_study: error: need --workers >= 0 and >= 3 distinct --batch-sizes (a B_crit fit)", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(args))


if __name__ == "__main__":
    main()
