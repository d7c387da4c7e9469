"""The GPU figures of one trial, side by side in one run (interleaved repetitions, medians): trial examples/s over
a bare PyTorch loop, the cost of global and per-bin GNS at their default cadences and of the every-step adaLN-gradient
GNS, and the host's input work.

Synthetic fast-DiT latents at the real shape (4x32x32, ``--n`` of them, packed float32: `bcrit pack-latents`'s
store). Every variant trains the same preset, global batch (= micro-batch) and precision (bf16 autocast on CUDA):

- **bare**: benchmarks/bench_trial_input.py's loop: one batch already on the device, AdamW, no data path, no GNS.
  It also gives model FLOP utilisation (FLOPs of one step from ``torch.utils.flop_counter`` over ``--peak-tflops``)
  and peak memory.
- **trial, GNS off**: `run_local` (the real `train_loop`: packed store, prefetch 2, on-device draws) with
  ``gns: false``, ``gns_adaln: false`` and per-bin GNS off: the trial's own overhead over bare.
- **trial, adaLN GNS**: GNS off but the default ``gns_adaln: true`` (the modulation linears' per-example gradients
  on every step, trainables.gns_adaln); its cost is over GNS off.
- **trial, global GNS**: the default ``gns: true``, adaLN off (at W = A = 1 the ``halves`` mode: two backward
  passes, on the steps its default cadence ``gns_global_every`` measures; the cost printed is over all timed steps).
- **trial, global + per-bin GNS**: also ``gns_every`` = half the steps, so one per-bin pass falls inside the
  timed steps; its cost is amortised to the config's default cadence ``gns_every`` (G): (time with bins - time
  without) / passes / (G x step time).

Rates are examples / the trial's ``train_seconds`` (CUDA-event step time; start-up, model build and the final
evaluation excluded; per-bin GNS passes included). The host's input work is the time the prefetch thread spends in
``Dataset.gather`` (reading the store, to float32 tensors; ``--n`` examples, page cache warm) per example, and the
time the step waits for its batch, both measured inside the GNS-off trial under full GPU load.

    PYTHONPATH=. python benchmarks/bench_gpu.py --device cuda --preset DiT-S/2 --batch 256 --steps 60 --reps 3
    PYTHONPATH=. .venv/bin/python benchmarks/bench_gpu.py --device cpu --preset tiny --batch 16 --steps 6 --reps 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_trial_input import bare_loop, make_folder  # noqa: E402

from trainables.config import TrialConfig  # noqa: E402
from trainables.data import base as data_base  # noqa: E402
from trainables.data import pipeline  # noqa: E402
from trainables.data.latent_store import pack  # noqa: E402
from trainables.trial import run_local  # noqa: E402

DEFAULT_GNS_EVERY = TrialConfig.__dataclass_fields__["gns_every"].default


class InputClock:
    """Seconds spent in ``Dataset.gather`` (examples gathered) and waiting in ``MicroBatches.get``, while on."""

    def __init__(self):
        self.gather_s = self.wait_s = 0.0
        self.examples = self.gets = 0
        self._gather, self._get = data_base.Dataset.gather, pipeline.MicroBatches.get

    def __enter__(self):
        clock = self

        def gather(ds, indices, split="train"):
            t0 = time.perf_counter()
            out = clock._gather(ds, indices, split)
            if split == "train":
                clock.gather_s += time.perf_counter() - t0
                clock.examples += len(indices)
            return out

        def get(mb, step, m):
            t0 = time.perf_counter()
            out = clock._get(mb, step, m)
            clock.wait_s += time.perf_counter() - t0
            clock.gets += 1
            return out

        data_base.Dataset.gather, pipeline.MicroBatches.get = gather, get
        return self

    def __exit__(self, *exc):
        data_base.Dataset.gather, pipeline.MicroBatches.get = self._gather, self._get


def trial(args, store: str, gns: bool, bins_every: int, clock: InputClock | None = None, adaln: bool = False) -> dict:
    cfg = TrialConfig(
        preset=args.preset, dataset=store, eval_size=16, batch_size=args.batch, micro_batch_size=args.batch,
        max_steps=args.steps, eval_every=args.steps, eval_repeats=1, gns=gns, gns_every=bins_every, gns_adaln=adaln,
        threads_per_worker=1, prefetch=2, lr=1e-4, use_gpu=args.device == "cuda", bf16=not args.no_bf16,
    )  # fmt: skip
    if clock is None:
        s = run_local(cfg).summary
    else:
        with clock:
            s = run_local(cfg).summary
    return {"ex_per_s": s["examples"] / s["train_seconds"], "step_s": s["train_seconds"] / args.steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="DiT-S/2")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n", type=int, default=8192, help="synthetic latents in the packed store")
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for MFU (H100/H200 SXM: 989)")
    ap.add_argument("--json", default=None, help="also write the medians here")
    args = ap.parse_args()
    half = max(1, args.steps // 2)
    info: dict = {}
    clock = InputClock()
    with tempfile.TemporaryDirectory() as tmp:
        folder, store = os.path.join(tmp, "lat"), os.path.join(tmp, "store")
        make_folder(folder, args.n)
        pack(folder, store, progress=False)
        bf16, dev = not args.no_bf16, args.device
        variants = {
            "bare": lambda: {"ex_per_s": bare_loop(args.preset, store, args.batch, args.steps, dev, bf16, info)},
            "trial gns off": lambda: trial(args, store, False, 0, clock),
            "trial adaln gns": lambda: trial(args, store, False, 0, adaln=True),
            "trial global gns": lambda: trial(args, store, True, 0),
            "trial global + per-bin gns": lambda: trial(args, store, True, half),
        }
        out: dict[str, list[dict]] = {k: [] for k in variants}
        for r in range(args.reps):
            for k, fn in variants.items():
                out[k].append(fn())
            print(f"rep {r}: " + "  ".join(f"{k} {v[-1]['ex_per_s']:.0f}" for k, v in out.items()), flush=True)
    med = {k: statistics.median(x["ex_per_s"] for x in v) for k, v in out.items()}
    step = {k: statistics.median(x["step_s"] for x in v) for k, v in out.items() if k != "bare"}
    bare = med["bare"]
    print(f"\n{args.device}, preset {args.preset}, batch {args.batch}, {args.steps} steps, medians of {args.reps}:")
    for k, v in med.items():
        print(f"  {k:28s} {v:9.1f} ex/s   ratio to bare {v / bare:.3f}")
    g = step["trial global gns"] / step["trial gns off"] - 1
    a = step["trial adaln gns"] / step["trial gns off"] - 1
    passes = args.steps // half
    per_pass = (step["trial global + per-bin gns"] - step["trial global gns"]) * args.steps / passes
    b = per_pass / (DEFAULT_GNS_EVERY * step["trial global gns"])
    k = TrialConfig(batch_size=args.batch, micro_batch_size=args.batch).global_gns_stages[0][1]
    measured = args.steps // k if k else 0
    print(f"global GNS: +{100 * g:.2f}% step time (default cadence: every {k} steps, {measured} of {args.steps} timed)")
    print(f"per-bin GNS: {per_pass * 1e3:.1f} ms a pass = +{100 * b:.2f}% at the default gns_every {DEFAULT_GNS_EVERY}")
    print(f"adaLN-gradient GNS (every step, global and per bin): +{100 * a:.2f}% step time")
    res = {"median_ex_per_s": med, "median_step_s": step, "global_gns_cost": g, "per_bin_gns_cost": b,
           "per_bin_pass_s": per_pass, "adaln_gns_cost": a}  # fmt: skip
    if clock.examples:
        res["host_gather_us_per_example"] = 1e6 * clock.gather_s / clock.examples
        res["step_wait_ms_per_step"] = 1e3 * clock.wait_s / max(1, clock.gets)
        print(
            f"host input (packed store, prefetch 2, under load): {res['host_gather_us_per_example']:.2f} us/example "
            f"gathered; the step waited {res['step_wait_ms_per_step']:.3f} ms per micro-batch"
        )
    if "flops_per_step" in info:
        mfu = info["flops_per_step"] / info["step_s"] / (args.peak_tflops * 1e12)
        res.update(mfu=mfu, tflop_per_step=info["flops_per_step"] / 1e12, peak_mem_gb=info["peak_mem_gb"])
        print(
            f"bare loop: {info['flops_per_step'] / 1e12:.2f} TFLOP per step, MFU {mfu:.3f} of "
            f"{args.peak_tflops:.0f} TFLOP/s, peak memory {info['peak_mem_gb']:.2f} GiB"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
