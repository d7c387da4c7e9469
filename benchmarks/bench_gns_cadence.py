"""Global GNS on a sparse schedule (issue 43): step time with global GNS on vs off, side by side in one run.

Gradient noise scale: McCandlish et al. 2018 (arXiv 1812.06162, App. A.1). At ``W = A = 1`` global GNS runs the
micro-batch as two half-size backward passes (mode ``halves``); ``gns_global_every`` (k) does so only at every k-th
optimizer step, the other steps run one backward exactly as with global GNS off. Variants, all ``B = 32``, each a
`TrainStep` + AdamW step on ONE shared model and optimizer (so no variant gets a luckier memory layout: with a model
each, two identical variants differed by 1-5%), every one running step ``s`` before any runs ``s + 1`` (the order
rotating), per-step CPU clock:

- ``off``: ``gns: false`` (one backward); ``off2``: the same again (the noise floor of two identical variants);
- ``every``: ``gns_global_every: 1``, the reference (two half backward passes at every step; before issue 43);
- ``sparse``: ``gns_global_every: k`` (default 0: the config's auto cadence for ``halves``);
- ``A=2 off / on``: ``micro 16 x A 2`` with global GNS off and on (mode ``micro-batches``, every step by default);
- per-bin GNS: one ``BinGNS.measure`` (K = 10 bins x 32 examples) amortised over ``gns_every`` steps of the
  default ``A = 1`` step (the sparse one), at the old default 300 and the config's default.

Ratios are of medians over the timed steps. The sparse step's mean is ``(t_every + (k - 1) t_skipped) / k`` (a
measured step runs the code of ``every``; a median over all sparse steps would ignore the measured ones); also
printed: the plain mean ratio over all steps ("direct"), and the amortised cost ``1 + (every - off) / (k off)``, which
a skipped step running the code of ``off`` (tests/trainables/test_gns_cadence.py) makes exact up to the noise of
``every - off``. On a shared machine two identical variants (``off`` and ``off2``) differ by 1-4%, more than the 2%
goal, so only the amortised figure resolves it. One torch thread; ``--clock cpu`` (default): the process's CPU time.

    .venv/bin/python benchmarks/bench_gns_cadence.py --presets tiny --steps 400
    .venv/bin/python benchmarks/bench_gns_cadence.py --presets DiT-S/2 --steps 40 --passes 2 --no-a2
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import bench_gns_overhead as overhead  # the GNS-cost bench: its clock and fresh model + optimizer + TrainStep
import torch

from trainables.config import TrialConfig, global_gns_every, measures_global
from trainables.data import load_dataset
from trainables.diffusion import make_scheduler
from trainables.gns_bins import BinGNS
from trainables.presets import build_dit
from trainables.step import TrainStep

CPU = torch.device("cpu")
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
WARM = 5  # step indices run and dropped before timing


def _stepper(cfg: TrialConfig, model, opt, data, sched):
    """``one_step(step) -> seconds``: ``cfg``'s `TrainStep` and an AdamW step on the shared ``model`` and ``opt``."""
    train_step = TrainStep(cfg, model, model, data, sched, 0, 1, CPU, contextlib.nullcontext)

    def one_step(step: int) -> float:
        t0 = overhead.clock()
        train_step(step)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return overhead.clock() - t0

    return one_step


def bench_preset(preset: str, steps: int, every: int, per_bin_every: list[int], a2: bool, passes: int) -> dict:
    """Every variant's step ``s`` for ``s`` in ``0..steps - 1``, interleaved step by step (the variants' order
    rotating), so a neighbour's load falls on all of them alike; ``off2`` repeats ``off`` (the noise floor). The
    first ``WARM`` step indices warm up and are dropped."""
    data, sched = load_dataset("digits", 297), make_scheduler()
    base = dict(preset=preset, batch_size=32, max_steps=10**6, gns_every=0)
    cfgs = {
        "off": TrialConfig(**base, micro_batch_size=32, gns=False),
        "off2": TrialConfig(**base, micro_batch_size=32, gns=False),
        "every": TrialConfig(**base, micro_batch_size=32, gns_global_every=1),
        "sparse": TrialConfig(**base, micro_batch_size=32, gns_global_every=every),
    }
    if a2:
        cfgs["A2 off"] = TrialConfig(**base, micro_batch_size=16, gns=False)
        cfgs["A2 on"] = TrialConfig(**base, micro_batch_size=16, gns_global_every=1)  # micro-batches every step
        cfgs["A2 auto"] = TrialConfig(**base, micro_batch_size=16)  # micro-batches at the auto cadence
    k = cfgs["sparse"].global_gns_stages[0][1]
    torch.manual_seed(0)
    model = build_dit(preset, sample_size=8, in_channels=1, num_classes=10).train()  # one model and AdamW for all
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steppers = {name: _stepper(cfg, model, opt, data, sched) for name, cfg in cfgs.items()}
    times: dict[str, list[float]] = {name: [] for name in cfgs}
    measured, skipped = [], []
    names = list(cfgs)
    for s in range(WARM + steps):
        turn = names[s % len(names) :] + names[: s % len(names)]
        got = {name: steppers[name](s) for name in turn}
        if s < WARM:
            continue
        for name, t in got.items():
            times[name].append(t)
        (measured if measures_global(s, k) else skipped).append(got["sparse"])
    bin_cfg = TrialConfig(**{**base, "gns_every": 300}, micro_batch_size=32, gns_bin_examples=32)
    model, _ = overhead._trainer(bin_cfg, data, sched)
    bins = BinGNS(bin_cfg, model, data, sched, 0, 1, CPU, contextlib.nullcontext)
    t_pass = []
    for i in range(1 + passes):
        t0 = overhead.clock()
        bins.measure(i)
        if i:
            t_pass.append(overhead.clock() - t0)
    mean = {name: statistics.fmean(ts) for name, ts in times.items()}
    med = {name: statistics.median(ts) for name, ts in times.items()}
    t_off, t_every, t_skip = med["off"], med["every"], statistics.median(skipped)
    t_meas = statistics.median(measured) if measured else float("nan")
    out = {
        "preset": preset,
        "k": k,
        "n": steps,
        "measured_steps": len(measured),
        "med": med,
        "mean": mean,
        "t_meas": t_meas,
        "t_skip": t_skip,
        "floor": med["off2"] / t_off,
        "every_ratio": t_every / t_off,
        "skip_ratio": t_skip / t_off,
        # a measured step runs the every-step code: its cost from the every-step variant's many samples
        "sparse_ratio": (t_every + (k - 1) * t_skip) / (k * t_off),
        "sparse_mean_ratio": mean["sparse"] / mean["off"],  # direct, when steps hold several measured steps
        "pass": statistics.median(t_pass),
    }
    t_default = (t_every + (k - 1) * t_skip) / k
    out["per_bin"] = {n: 1 + out["pass"] / (n * t_default) for n in per_bin_every}
    out["pass_steps"] = out["pass"] / t_default
    if a2:
        out["a2"] = (med["A2 on"], med["A2 off"], mean["A2 auto"] / mean["A2 off"], cfgs["A2 auto"].global_gns_stages)
    return out


def main() -> None:
    defaults = TrialConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", nargs="+", default=["tiny", "DiT-S/2"])
    p.add_argument("--steps", type=int, default=400, help="timed step indices (every variant runs each one)")
    p.add_argument("--every", type=int, default=0, help="the sparse variant's gns_global_every (0 = auto)")
    p.add_argument("--gns-every", type=int, nargs="+", default=sorted({300, defaults.gns_every}))
    p.add_argument("--passes", type=int, default=3, help="timed per-bin passes (after one warm-up)")
    p.add_argument("--no-a2", action="store_true", help="skip the W=1, A=2 variants")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    args = p.parse_args()
    overhead.clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    print(
        f"digits 8x8, B=32, 1 thread, {args.clock} clock, medians of {args.steps} step indices per variant "
        f"(interleaved step by step); auto halves cadence {global_gns_every('halves', 0)}, default gns_every "
        f"{defaults.gns_every}"
    )
    for preset in args.presets:
        r = bench_preset(preset, args.steps, args.every, args.gns_every, not args.no_a2, args.passes)
        k, med = r["k"], {n: v * 1e3 for n, v in r["med"].items()}
        print(f"\n{preset}: ratio to W=A=1 off")
        print(f"  W=A=1 off (one backward)            {med['off']:9.2f} ms  1.0000")
        print(f"  W=A=1 off again (noise floor)       {med['off2']:9.2f} ms  {r['floor']:.4f}")
        print(f"  W=A=1 halves every step (k=1)       {med['every']:9.2f} ms  {r['every_ratio']:.4f}  (the reference)")
        print(
            f"  W=A=1 halves every {k}th step (k={k}) {r['sparse_ratio'] * med['off']:9.2f} ms  "
            f"{r['sparse_ratio']:.4f}  = (every + {k - 1} skipped) / {k}; skipped steps {r['skip_ratio']:.4f} x off"
        )
        print(
            f"    amortised: 1 + (every - off) / ({k} off) = {1 + (r['every_ratio'] - 1) / k:.4f}  "
            "(a skipped step runs the code of off: tested)"
        )
        print(
            f"    direct: mean sparse / mean off = {r['sparse_mean_ratio']:.4f} over {r['n']} steps "
            f"({r['measured_steps']} measured; median measured step {r['t_meas'] * 1e3:.2f} ms)"
        )
        if "a2" in r:
            on, off = (x * 1e3 for x in r["a2"][:2])
            k2 = r["a2"][3][0][1]
            print(f"  W=1 A=2 micro-batches every step / off  {on:9.2f} / {off:.2f} ms  {on / off:.4f}")
            print(
                f"  W=1 A=2 micro-batches auto (every {k2}): amortised 1 + (every - off) / {k2} = "
                f"{1 + (on / off - 1) / k2:.4f}; direct mean auto / mean off = {r['a2'][2]:.4f}"
            )
        per_bin = "   ".join(f"gns_every {n}: {v:.4f}" for n, v in r["per_bin"].items())
        print(f"  per-bin pass {r['pass']:.2f} s = {r['pass_steps']:.1f} default steps;   {per_bin}")


if __name__ == "__main__":
    main()
