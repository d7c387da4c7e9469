"""Trial examples/s with prefetch on vs off, on a packed store vs a latent folder, vs a bare PyTorch loop whose
data already sits on the device; side by side in one run (interleaved repetitions, medians).

Synthetic fast-DiT latents at the real shape (32x32x4; ``--n`` of them, written to a folder and packed float32).
Every variant trains the same preset, global batch and precision for ``--steps`` steps, with one torch thread:

- **bare**: a batch already in memory, ``torch.randn`` noise, uniform timesteps, AdamW (no data path at all);
- **trial**: `run_local` (the real `train_loop`: pipeline, on-device draws, one host read per step), GNS off,
  one evaluation at the end (excluded, as are start-up and model build: examples / ``train_seconds``), with
  ``prefetch`` 2 (a background thread gathers the next micro-batches) or 0 (gathered inside the step).

Ratios: trial / bare examples/s (the issue's target >= 0.95), and prefetch on / off. ``--clock cpu`` counts CPU
seconds of this process on both sides (the trial's `StepTimer` clock is swapped): robust on a shared machine, but
it counts the prefetch thread's work too, so it measures work, not overlap; ``--clock wall`` (default) on an idle
machine measures what prefetch hides. With ``--device cuda``
(``make bench-gpu``) both sides run on the GPU with bf16 autocast (``--no-bf16`` for float32), and the bare loop
also reports model FLOP utilisation (FLOPs counted by ``torch.utils.flop_counter`` on one step, over
``--peak-tflops``) and peak memory. Not yet run on a GPU: no GPU was lent while this was written.

``--compile`` adds compiled vs eager pairs, compilation excluded on both sides: the bare loop timed from its second
step (``compile_model``, as the trial's ``compile: true``), and the trial (store, prefetch 2) timed over its second
half (its own ``sys/examples_per_s`` row of the last report interval); it also prints the trial's training seconds
of the first half (compilation included) and of all steps. ``--compile-only`` runs just the bare loop and those.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_trial_input.py --preset tiny --batch 64 --steps 30 --reps 3
    PYTHONPATH=. .venv/bin/python benchmarks/bench_trial_input.py --preset DiT-S/2 --batch 8 --steps 4 --reps 2
    PYTHONPATH=. .venv/bin/python benchmarks/bench_trial_input.py --device cuda --preset DiT-S/2 --batch 256 \
        --steps 50 --reps 3 --n 20000 --compile
    PYTHONPATH=. .venv/bin/python benchmarks/bench_trial_input.py --clock cpu --preset tiny --batch 64 --steps 20 \
        --reps 2 --n 2048 --compile --compile-only
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import tempfile
import time

import numpy as np
import torch

from analysis.core import metrics as M
from trainables import timing
from trainables.compiling import compile_model
from trainables.config import TrialConfig
from trainables.data import load_dataset
from trainables.data.latent_store import pack
from trainables.diffusion import make_scheduler, per_example_loss
from trainables.presets import build_dit
from trainables.trial import run_local


def make_folder(root: str, n: int) -> None:
    os.makedirs(os.path.join(root, "imagenet256_features"))
    os.makedirs(os.path.join(root, "imagenet256_labels"))
    rng = np.random.default_rng(0)
    for i in range(n):
        np.save(os.path.join(root, "imagenet256_features", f"{i}.npy"), rng.standard_normal((1, 4, 32, 32), np.float32))
        np.save(os.path.join(root, "imagenet256_labels", f"{i}.npy"), np.array([i % 1000], np.int64))


def bare_loop(
    preset: str, dataset: str, batch: int, steps: int, device: str, bf16: bool, info_out=None, compiled=None
) -> float:
    """examples/s of a plain loop on one fixed batch already on the device. ``compiled`` True/False (the
    ``--compile`` pairs): the model compiled in place as the trial's ``compile: true`` does, or not, timed after
    one uncounted warm-up step (which compiles it)."""
    torch.set_num_threads(1)
    data = load_dataset(dataset, 16)
    info = data.info
    torch.manual_seed(0)
    model = build_dit(preset, sample_size=info.image_size, in_channels=info.channels, num_classes=info.num_classes)
    model = model.to(device).train()
    if compiled:
        compile_model(model, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = make_scheduler()
    x, y = (v.to(device) for v in data.get(np.arange(batch)))
    cuda = device == "cuda"
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda and bf16 else contextlib.nullcontext

    def step():
        t = torch.randint(0, 1000, (batch,), device=device)
        noise = torch.randn_like(x)
        with autocast():
            loss = per_example_loss(model, sched, x, y, t, noise).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if compiled is not None:
        step()  # compilation excluded (the compiled trial's rate is also read after its first interval)
    t0 = timing.CLOCK()  # the first step included, as in the trial's train_seconds
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    seconds = timing.CLOCK() - t0
    if info_out is not None and cuda:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            step()
        info_out["flops_per_step"] = counter.get_total_flops()
        info_out["step_s"] = seconds / steps
        info_out["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return batch * steps / seconds


def trial(
    preset: str, dataset: str, batch: int, steps: int, prefetch: int, device: str, bf16: bool, compiled=None, info=None
) -> float:
    """examples / train_seconds of the whole trial. ``compiled`` True/False (the ``--compile`` variants): with
    ``compile`` set so, the rate of the second half of the steps (a report every ``steps // 2``), read from the
    trial's own ``sys/examples_per_s`` rows, so that compilation (in the first interval) is excluded."""
    cfg = TrialConfig(
        preset=preset, dataset=dataset, eval_size=16, batch_size=batch, micro_batch_size=batch, max_steps=steps,
        eval_every=steps, eval_repeats=1, gns=False, gns_every=0, threads_per_worker=1, prefetch=prefetch, lr=1e-4,
        use_gpu=device == "cuda", bf16=bf16, compile=bool(compiled),
        report_every=0 if compiled is None else max(1, steps // 2),
    )  # fmt: skip
    session = run_local(cfg)
    if compiled is not None:
        rows = [r for rep in session.reports for r in rep["rows"] if r[2] == M.SYS_EXAMPLES_PER_S]
        if info is not None:  # training seconds of the first interval (compilation included) and the whole trial
            info.setdefault("compiled" if compiled else "eager", []).append((rows[0][4], rows[-1][4]))
        return rows[-1][3]
    s = session.summary
    return s["examples"] / s["train_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n", type=int, default=4096, help="synthetic latents")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"], help="CPU-side clock (see above)")
    ap.add_argument("--no-bf16", action="store_true", help="float32 on the GPU (default: bf16 autocast)")
    ap.add_argument("--compile", action="store_true", help="add compiled (torch.compile) bare and trial variants")
    ap.add_argument("--compile-only", action="store_true", help="with --compile: only the bare loop and those")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for MFU (H100 SXM: 989)")
    args = ap.parse_args()
    dev, bf16 = args.device, not args.no_bf16
    if args.clock == "cpu":
        timing.CLOCK = time.process_time
    gpu_info: dict = {}
    compile_info: dict = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder, store = os.path.join(tmp, "lat"), os.path.join(tmp, "store")
        make_folder(folder, args.n)
        pack(folder, store, progress=False)
        variants = {
            "bare (data in memory)": lambda: bare_loop(args.preset, store, args.batch, args.steps, dev, bf16, gpu_info),
            "trial store prefetch 2": lambda: trial(args.preset, store, args.batch, args.steps, 2, dev, bf16),
            "trial store prefetch 0": lambda: trial(args.preset, store, args.batch, args.steps, 0, dev, bf16),
            "trial folder prefetch 2": lambda: trial(args.preset, folder, args.batch, args.steps, 2, dev, bf16),
            "trial folder prefetch 0": lambda: trial(args.preset, folder, args.batch, args.steps, 0, dev, bf16),
        }
        if args.compile and args.compile_only:
            variants = {k: v for k, v in variants.items() if k.startswith("bare")}
        if args.compile:  # compiled vs eager, compilation excluded on both sides
            for c in (False, True):
                kind = "compiled" if c else "eager"
                variants[f"bare, 2nd step on, {kind}"] = functools.partial(
                    bare_loop, args.preset, store, args.batch, args.steps, dev, bf16, None, c
                )
                variants[f"trial 2nd half, {kind}"] = functools.partial(
                    trial, args.preset, store, args.batch, args.steps, 2, dev, bf16, c, compile_info
                )
        out: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(args.reps):
            for k, fn in variants.items():
                out[k].append(fn())
            print(f"rep {r}: " + "  ".join(f"{k} {v[-1]:.1f}" for k, v in out.items()), flush=True)
    med = {k: statistics.median(v) for k, v in out.items()}
    bare = med["bare (data in memory)"]
    precision = "bf16 autocast" if dev == "cuda" and bf16 else "float32"
    print(
        f"\n{dev}, {precision}, {args.clock} clock, preset {args.preset}, latents 4x32x32, batch {args.batch}, "
        f"{args.steps} steps, medians of {args.reps}:"
    )
    for k, v in med.items():
        print(f"  {k:26s} {v:8.1f} ex/s   ratio to bare {v / bare:.3f}")
    for src in ("store", "folder") if "trial store prefetch 0" in med else ():
        on, off = med[f"trial {src} prefetch 2"], med[f"trial {src} prefetch 0"]
        print(f"prefetch on / off ({src}): {on / off:.3f}")
    if args.compile:
        bc, be = (med[f"bare, 2nd step on, {k}"] for k in ("compiled", "eager"))
        tc, te = (med[f"trial 2nd half, {k}"] for k in ("compiled", "eager"))
        print(f"compiled / eager (compilation excluded): bare {bc / be:.3f}, trial (store, prefetch 2) {tc / te:.3f}")
        for kind, runs in compile_info.items():
            first = statistics.median(f for f, _ in runs)
            total = statistics.median(t for _, t in runs)
            print(
                f"trial {kind}: first {max(1, args.steps // 2)} steps {first:.1f} s, all {args.steps} steps "
                f"{total:.1f} s of training time ({args.clock} clock; per repetition: {runs})"
            )
    if gpu_info:
        mfu = gpu_info["flops_per_step"] / gpu_info["step_s"] / (args.peak_tflops * 1e12)
        print(
            f"bare loop: {gpu_info['flops_per_step'] / 1e12:.2f} TFLOP per step, MFU {mfu:.3f} of "
            f"{args.peak_tflops:.0f} TFLOP/s, peak memory {gpu_info['peak_mem_gb']:.2f} GiB"
        )


if __name__ == "__main__":
    main()
