"""`make gpu-proof`: on one H100 or H200, in one command of at most 8 minutes, the GPU tests, the trial against a bare
loop with the GNS cost at the current defaults, a DiT-S/2 critical-batch-size study with several trials at once on
the GPU, and `bcrit analyze` of it: the log ends with a GPU-scale B_crit, its 90% interval and its flags.

    make gpu-proof GPU_OUT=DIR                           # a GPU machine: the venv's python, else python3
    python3 benchmarks/gpu_proof.py --out "$OUT"            # the same without make (the lent device: see below)
    .venv/bin/python benchmarks/gpu_proof.py --out /tmp/proof --smoke   # the CPU rehearsal (tests/test_gpu_proof.py)

Parts (``--parts``, in this order), each a subprocess with a time limit, its lines timestamped into OUT/proof.log:

1. ``tests``: ``pytest -m gpu tests/trainables/test_gpu.py`` (limit 120 s);
2. ``bench``: benchmarks/bench_gpu.py, DiT-S/2 at B = 256, 2 interleaved repetitions of 40 steps: bare loop, trial
   with GNS off, with the every-step adaLN-gradient GNS, with global GNS at its default cadence, with per-bin GNS
   too; MFU, memory (limit 130 s;
   OUT/bench.json);
3. ``study``: benchmarks/gpu_study.py into OUT/study (trials.parquet, metrics.parquet, study.json): DiT-S/2 on
   16,384 packed synthetic latents, B in {32, 64, 128, 256} x lr {4e-4, 8e-4} x sqrt(B/256) x seeds {0, 1} = 16
   trials, ``--workers`` (default 4) processes on the one GPU, eager (``--compile``: compiled), each trial stopping at
   eval loss 0.12 or its step budget; its deadline is whatever the clock leaves (below);
4. ``analyze``: ``python -m orchestrator.cli.main analyze OUT/study --no-mlflow --no-plots --out OUT/analysis``
   (bcrit.json, report.md, report.html; should it run out of time, once more in the margin without the calibrated
   level and with 200 replicates), then the answer's lines from bcrit.json: every target's B_crit, 90% interval
   and flags, and last the one to quote (the lowest unflagged target, else the one with the fewest flags).

The study's processes share the GPU by time-slicing (no MPS is started): their kernels do not run side by side, but
each fills the GPU's idle time between another's launches, which is most of a small-batch step's time. ``--workers``
is lowered to what the GPU's memory holds at 17 GiB a worker (B = 256: 15.7 GiB peak). ``compile`` stays off: the
compiled step ran 1.77x faster at B = 256 (RESULTS.md), which would save at most ~45% of a trial's 7-23 s of steps
here, while every trial builds a new model that is traced and compiled again (per batch size); that cost, cold or
from inductor's cache, was never measured, so ``--compile`` is there to measure it, not the default.

OUT ends with 8 files at most, 2 folders deep at most (what the device tool brings back): proof.log, bench.json,
study/{trials,metrics}.parquet, study/study.json, analysis/{bcrit.json,report.md,report.html}; the study's part
files are removed once compacted (``--keep-parts`` keeps them). Exit status: 0 when every part passed and a B_crit
was fitted, 1 otherwise, 2 for input refused before anything ran (no CUDA without ``--smoke``, a missing package,
an OUT that holds an earlier study, a bad argument): one line on stderr.

On the lent device (its python3: torch 2.11+cu130, numpy, scipy, pyarrow, pytest; no Ray, MLflow or Optuna, which
nothing here imports; no diffusers; ``make`` not known to be there): ``.whl`` holds diffusers' wheel
(``pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl diffusers==0.42.1``); name ``.whl`` in
``carry``, ``timeout_s`` 560, and run ``python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
--upgrade --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site python3 benchmarks/gpu_proof.py --out $OUT``.

Sizing (the figures of benchmarks/RESULTS.md, "GPU", 2026-11-26 H200 and 2026-11-27 H100; eager, bf16):

- One trial alone at B = 256 steps in 78 ms (H200) / 90 ms (H100) with GNS off. Global GNS (``halves``) costs
  +52% / +69% on the steps that measure it; at its default cadence (every 40th step) that is about +1.5%.
  Per-bin GNS (1.4-1.5 s a pass) does not run in a trial shorter than ``gns_every`` (1000 steps). Small batches are
  bound by kernel launches: the 2026-11-26 study's B = 32 / 64 steps took 115-120 ms with two backward passes on
  every step and a per-bin pass every 100 steps, so about 80 ms with one. Model used here: 90 ms a step alone for
  every B in 32..256, and 4 processes on the one GPU slowing each by c = 2 (not measured yet: the study's log
  measures it, "training time ... x the wall clock") -> 180 ms a step.
- Steps: 80 x sqrt(256 / B) -> 226, 160, 113, 80 at B = 32, 64, 128, 256: 579 per (lr, seed), 2,316 in all;
  2,316 x 0.18 s / 4 workers = 104 s. Evaluations: 25 a trial of 512 x 2 draws, 4 forward chunks of 256 at ~30
  ms = 0.12 s alone: 16 x 25 x 0.12 s x c / 4 = 24 s. A trial's start (model, held-out draws, step-0
  evaluation) ~3 s: 16 x 3 / 4 = 12 s. Workers' start (imports, CUDA context) ~15 s, beside making the data (5.4 s
  measured for 16,384 latents). Study: 15 + 104 + 24 + 12 = ~155 s, ~170 s with the last trials' imbalance.
- Whole: preflight ~8 s, tests 82 s measured on the H100 (limit 120), bench 2 x ~46 s (a 60-step repetition took
  55-60 s on the H100: ~25 s of start-up per 4 variants and ~30 s of steps; a fifth variant, adaLN GNS, since:
  limit 130), study ~170 s, analyze ~30 s
  (1000 bootstrap replicates and the calibrated level; reserve 60 s): ~380 s expected of 480.
- The clock decides the study's deadline: everything ends by ``--total-s`` (480) - ``--margin-s`` (30) = 450 s
  after the start, analyze gets its 60 s, and the study ends its trials 30 s before that (20 s grace, 10 s to
  compact and exit): deadline = 360 s after the start minus what the parts before it took (~175 s if they take
  ~185 s; 102 s if tests and bench both reach their limits). A trial still running then ends at its next
  evaluation and counts as ``budget_spent`` (censored there), and no trial starts with less than 15 s left, so a
  slower GPU gives fewer or shorter trials, never a run past 8 minutes.

``--smoke``: the same parts and code on a CPU (tests/test_gpu_proof.py): the tiny preset, B in {2, 4, 8}, 2 learning
rates, 1 seed, 2 workers, 16 held-out examples, the GPU tests skipped by pytest, bench at 4 steps, analyze without
the calibrated level and with 200 bootstrap replicates; limits scaled for a loaded 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("tests", "bench", "study", "analyze")
GIB = 2**30
MEM_PER_WORKER_GIB = 17  # DiT-S/2 at B = 256: 15.7 GiB peak (RESULTS.md, "GPU") and a CUDA context
FALLBACK = ("--no-calibration", "--bootstrap", "200")  # analyze again with these when it ran out of time
OUT_FILES = ("proof.log", "bench.json", "study", "analysis")


class Refused(Exception):
    """Input refused before anything ran: one line, exit status 2."""


# --- the log ------------------------------------------------------------------------------------------------------
class Log:
    """Lines to stdout and OUT/proof.log, each prefixed with the UTC time and the seconds since the start."""

    def __init__(self, path: str, t0: float):
        self.t0 = t0
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the whole run)

    def __call__(self, text: str) -> None:
        now = time.time()
        stamp = f"[{time.strftime('%H:%M:%S', time.gmtime(now))} +{now - self.t0:5.0f} s]"
        for line in str(text).splitlines() or [""]:
            out = f"{stamp} {line}"
            print(out, flush=True)
            self.f.write(out + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def run_part(log: Log, name: str, cmd: list[str], limit_s: float, env: dict) -> int:
    """Run ``cmd`` (its own process group, in this session), its output into the log line by line; past ``limit_s``,
    or when this script is interrupted or terminated, the whole group is ended (TERM, then KILL 5 s later: the
    study's worker processes too). Returns the exit status (124: past its limit)."""
    log(f"=== {name}: {shlex.join(cmd)}  (limit {limit_s:.0f} s)")
    t = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", process_group=0)  # fmt: skip
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    end, rc, finished = t + limit_s, None, False
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.05, min(1.0, end - time.time())))
            except queue.Empty:
                if time.time() < end:
                    continue
                log(f"{name}: past its limit of {limit_s:.0f} s: ending it")
                rc = 124
                break
            if line is None:
                finished = True
                break
            log(line)
    finally:  # past the limit, or this script interrupted or terminated: end the group
        if not finished:
            if rc is None:
                log(f"{name}: interrupted: ending it")
            _end_group(proc)
    proc.wait()
    rc = proc.returncode if rc is None else rc
    log(f"=== {name}: exit status {rc} after {time.time() - t:.0f} s")
    return rc


def _end_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if sig == signal.SIGTERM:
            time.sleep(0.5)  # the group's other processes: a moment to exit on TERM before the KILL


# --- before anything runs -----------------------------------------------------------------------------------------
def preflight(args) -> dict:
    """Everything that can be refused before a part runs (raises Refused); returns what the log's header shows."""
    bad = [p for p in args.parts if p not in PARTS]
    if bad or not args.parts:
        raise Refused(f"--parts {','.join(args.parts)}: choose from {','.join(PARTS)}")
    if args.workers < 1:
        raise Refused(f"--workers {args.workers}: need at least 1 worker process")
    if args.total_s < 120:
        raise Refused(f"--total-s {args.total_s:g}: give the whole run at least 120 s")
    out = os.path.abspath(args.out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise Refused(f"--out {args.out}: exists and is not a directory")
    earlier = [n for n in OUT_FILES[2:] if os.path.exists(os.path.join(out, n))]
    if earlier:
        raise Refused(
            f"--out {args.out} holds an earlier run's {' and '.join(earlier)}: give a new --out, or remove it"
        )
    missing = [m for m in ("numpy", "pyarrow", "scipy", "torch", "diffusers", "pytest") if not find_spec(m)]
    if missing:
        raise Refused(
            f"{', '.join(missing)} not importable by {sys.executable}: install them (on the lent device, carry "
            "diffusers as a wheel in .whl: benchmarks/gpu_proof.py's docstring)"
        )
    info = {"python": platform.python_version(), "torch": _version("torch"), "diffusers": _version("diffusers")}
    if args.smoke:  # no torch import here: the parts import it
        return {**info, "device": f"cpu ({os.cpu_count()} cores), --smoke"}
    import torch

    info["cuda"] = torch.version.cuda
    if not torch.cuda.is_available():
        raise Refused(
            f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none; run this on a GPU "
            "machine, or pass --smoke for the CPU rehearsal"
        )
    p = torch.cuda.get_device_properties(0)
    fits = max(1, int(p.total_memory / GIB // MEM_PER_WORKER_GIB))
    info["device"] = (
        f"{p.name}, {p.total_memory / GIB:.0f} GiB, {torch.cuda.device_count()} visible, cc {p.major}.{p.minor}"
    )
    if args.workers > fits:
        info["workers"] = f"--workers {args.workers} -> {fits}: {MEM_PER_WORKER_GIB} GiB each at B = 256"
        args.workers = fits
    return info


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:  # importable without metadata (a copied folder)
        return "(no metadata)"


def machine_lines() -> list[str]:
    """Driver, git commit, CPU: what the log needs to place its figures (best effort; absent tools say so)."""
    out = []
    for cmd in (["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                ["git", "-C", ROOT, "rev-parse", "HEAD"], ["git", "-C", ROOT, "status", "--short"]):  # fmt: skip
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            text = (r.stdout.strip() or r.stderr.strip() or "(nothing)").splitlines()
            out.append(f"{shlex.join(cmd[:1] + cmd[3:] if cmd[0] == 'git' else cmd[:1])}: {text[0]}"
                       + (f" (+{len(text) - 1} lines)" if len(text) > 1 else ""))  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append(f"{cmd[0]}: unavailable ({type(e).__name__})")
    out.append(f"cpus: {os.cpu_count()}, host {platform.node()}, {platform.platform()}")
    return out


# --- the parts ----------------------------------------------------------------------------------------------------
def commands(args, out: str) -> dict[str, list[str]]:
    py = sys.executable
    study_dir = os.path.join(out, "study")
    if args.smoke:
        bench = ["--device", "cpu", "--preset", "tiny", "--batch", "8", "--steps", "4", "--reps", "1", "--n", "256"]
        study = ["--device", "cpu", "--preset", "tiny", "--batch-sizes", "2", "4", "8", "--lr", "8e-3", "--seeds",
                 "0", "--steps", "4", "--min-steps", "10", "--evals", "8", "--eval-size", "16", "--eval-repeats",
                 "1", "--n", "128", "--classes", "4", "--min-left-s", "5"]  # fmt: skip
        analyze = ["--bootstrap", "200", "--no-calibration"]
    else:
        bench = ["--device", "cuda", "--preset", "DiT-S/2", "--batch", "256", "--steps", "40", "--reps", "2", "--n",
                 "4096"]  # fmt: skip
        study = ["--device", "cuda"]  # gpu_study.py's defaults are this proof's GPU study
        analyze = []
    study += ["--workers", str(args.workers), "--grace-s", "20"] + (["--compile"] if args.compile else [])
    return {
        "tests": [py, "-m", "pytest", "-m", "gpu", "tests/trainables/test_gpu.py", "-q", "-p", "no:cacheprovider"],
        "bench": [py, "benchmarks/bench_gpu.py", *bench, "--json", os.path.join(out, "bench.json")],
        "study": [py, "benchmarks/gpu_study.py", "--out", study_dir, *study, *shlex.split(args.study_args)],
        "analyze": [py, "-m", "orchestrator.cli.main", "analyze", study_dir, "--no-mlflow", "--no-plots",
                    "--out", os.path.join(out, "analysis"), *analyze],
    }  # fmt: skip


def answer_lines(path: str) -> tuple[list[str], bool]:
    """The answer from bcrit.json: every target's B_crit, interval and flags, then the one to quote (the lowest
    unflagged target, else the one with the fewest flags); whether any B_crit was fitted."""
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError) as e:
        return [f"no answer: {path} unreadable ({type(e).__name__})"], False
    fitted = [t for t in res.get("targets", []) if t.get("b_crit") is not None and math.isfinite(t["b_crit"])]
    if not fitted:
        return [f"no B_crit fitted ({res.get('metric')}; notes: {res.get('notes')})"], False
    lines = []
    for t in fitted:
        lo, hi = t.get("b_crit_ci") or (float("nan"), float("nan"))
        pts = t.get("points", [])
        lines.append(f"target {t['target']:g}: B_crit {t['b_crit']:.4g}, 90% CI [{lo:.4g}, {hi:.4g}], {len(pts)} "
                     f"batch sizes, flags: {', '.join(t.get('flags') or []) or 'none'}")  # fmt: skip
    clean = [t for t in fitted if not t.get("flags")]
    pick = min(clean, key=lambda t: t["target"]) if clean else min(fitted, key=lambda t: (len(t["flags"]), t["target"]))
    lo, hi = pick.get("b_crit_ci") or (float("nan"), float("nan"))
    flags = ", ".join(pick.get("flags") or []) or "none (trustworthy by analyze's checks)"
    lines.append(
        f"GPU B_crit ({res.get('metric')}, {res.get('n_trials')} trials): {pick['b_crit']:.4g} at target "
        f"{pick['target']:g}, 90% CI [{lo:.4g}, {hi:.4g}]; flags: {flags}"
    )
    return lines, True


def tidy_study(log: Log, study_dir: str, keep_parts: bool) -> None:
    """Remove the study's part files once both tables exist (they hold every row), so OUT stays within 8 files."""
    parts = os.path.join(study_dir, "parts")
    tables = [os.path.join(study_dir, f) for f in ("trials.parquet", "metrics.parquet")]
    if not keep_parts and os.path.isdir(parts) and all(map(os.path.isfile, tables)):
        shutil.rmtree(parts)
        log(f"removed {parts} (compacted into trials.parquet and metrics.parquet)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for proof.log, bench.json, study/ and analysis/")
    ap.add_argument("--smoke", action="store_true", help="the CPU rehearsal: tiny sizes, same parts and code")
    ap.add_argument("--parts", type=lambda s: [p for p in s.replace(",", " ").split() if p], default=list(PARTS),
                    help=f"comma-separated, of {','.join(PARTS)} (default: all, in that order)")  # fmt: skip
    ap.add_argument("--workers", type=int, default=None, help="trials at once, worker processes (4; --smoke: 2)")
    ap.add_argument("--compile", action="store_true", help="compile the study's trials (off: not measured to pay)")
    ap.add_argument("--study-args", default="", help="more gpu_study.py arguments, e.g. '--lr-mults 0.5 1 2'")
    ap.add_argument("--total-s", type=float, default=480.0, help="the whole run's limit (default 8 minutes)")
    ap.add_argument("--margin-s", type=float, default=30.0, help="kept free at the end of --total-s")
    ap.add_argument("--analyze-s", type=float, default=60.0, help="reserved for analyze")
    ap.add_argument("--keep-parts", action="store_true", help="keep OUT/study/parts (more than 8 files)")
    args = ap.parse_args(argv)
    if args.workers is None:
        args.workers = 2 if args.smoke else 4
    t0 = time.time()
    try:
        info = preflight(args)
    except Refused as e:
        print(f"gpu-proof: error: {e}", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    log = Log(os.path.join(out, "proof.log"), t0)
    end = t0 + args.total_s - args.margin_s
    smoke = args.smoke
    log(f"gpu-proof: {shlex.join([sys.executable, *sys.argv])}")
    log(f"start {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(t0))}; ends by +{end - t0:.0f} s; parts "
        f"{','.join(args.parts)}; " + "; ".join(f"{k} {v}" for k, v in info.items()))  # fmt: skip
    for line in machine_lines():
        log(line)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    cmds = commands(args, out)
    limits = {"tests": 240 if smoke else 120, "bench": 240 if smoke else 130}
    rcs: dict[str, int] = {}
    for part in (p for p in PARTS if p in args.parts):
        left = end - time.time()
        cmd = cmds[part]
        if part == "study":
            grace = 30.0  # the study's --grace-s 20, then compaction and exit
            deadline = left - args.analyze_s * ("analyze" in args.parts) - grace
            if deadline < 30:
                log(f"=== study: skipped, {deadline:.0f} s would be left for it")
                rcs[part] = 1
                continue
            cmd = [*cmd, "--deadline-s", f"{deadline:.0f}"]
            limit = deadline + grace
        else:
            limit = min(limits.get(part, left), left)
        if limit < 5:
            log(f"=== {part}: skipped, {left:.0f} s left")
            rcs[part] = 1
            continue
        rcs[part] = run_part(log, part, cmd, limit, env)
        if part == "study":
            tidy_study(log, os.path.join(out, "study"), args.keep_parts)
        last = t0 + args.total_s - 5 - time.time()  # the margin, for a quicker analysis when the full one ran out
        if part == "analyze" and rcs[part] == 124 and last > 20:
            rcs[part] = run_part(log, "analyze, uncalibrated", [*cmd, *FALLBACK], last, env)
    lines, ok = answer_lines(os.path.join(out, "analysis", "bcrit.json")) if "analyze" in args.parts else ([], True)
    files = sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs)
    rc = 0 if ok and not any(rcs.values()) else 1
    statuses = ", ".join(f"{k} {v}" for k, v in rcs.items())
    log(f"{len(files) + ('proof.log' not in files)} files in {out}: {' '.join(files)}")
    log(f"gpu-proof: exit status {rc} after {time.time() - t0:.0f} s of {args.total_s:.0f}; parts: {statuses}")
    for line in lines:  # the answer last
        log(line)
    log.close()
    return rc


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a TERM ends the running part's group too (run_part)
    sys.exit(main())
