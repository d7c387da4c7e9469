"""Step time with GNS on vs off, side by side in one run (interleaved repetitions, medians).

Gradient noise scale: McCandlish et al. 2018 (arXiv 1812.06162, App. A.1). Two overheads are measured:

- **global GNS** (``cfg.gns``): ``TrainStep`` + optimizer step with ``gns=True`` vs ``gns=False`` at ``W = 1,
  A = 2`` (every micro-batch's gradient norm, read as the change of ``.grad``: one buffer copy and one subtraction
  and norm per micro-step). Target <= 1%.
- **halves** (``gns_halves``, W = A = 1): the step as two backward passes over the two halves of its micro-batch
  (global GNS on) vs one backward with global GNS off, both at ``B = micro = 32``: what global GNS costs a trial
  that does not accumulate.
- **per-bin GNS** at the default cadence: the median ``BinGNS.measure`` time divided by ``gns_every`` steps of
  the median training step (``A = 1``, the trial's default split); the amortised overhead. Target <= 5%.

Presets: ``tiny`` and ``DiT-S/2`` shapes on the shipped 8x8 digits (16 tokens; CPU), or any fast-DiT latent
folder with ``--dataset``. One torch thread (the trial's default ``cpus_per_worker=1``).

    .venv/bin/python benchmarks/bench_gns_overhead.py --presets tiny DiT-S/2 --reps 7
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from trainables.config import TrialConfig
from trainables.data import load_dataset
from trainables.diffusion import make_scheduler
from trainables.gns_bins import BinGNS
from trainables.presets import build_dit
from trainables.step import TrainStep

CPU = torch.device("cpu")
# --clock cpu (default): CPU seconds of this process, robust on a shared machine where wall time mostly measures
# waiting for a core; with one torch thread it is the step's compute. --clock wall for an idle machine.
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = time.process_time


def _trainer(cfg: TrialConfig, data, sched):
    """A fresh model, optimizer and ``TrainStep``; returns ``(model, one_step)``."""
    info = data.info
    torch.manual_seed(cfg.seed)
    model = build_dit(cfg.preset, sample_size=info.image_size, in_channels=info.channels, num_classes=info.num_classes)
    model = model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    train_step = TrainStep(cfg, model, model, data, sched, 0, 1, CPU, contextlib.nullcontext)

    def one_step(step: int) -> float:
        t0 = clock()
        train_step(step)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return clock() - t0

    return model, one_step


def bench_preset(preset: str, dataset: str, reps: int, steps: int, gns_every: int, bin_examples: int) -> dict:
    """Interleaved repetitions of: global on, global off, A=1 steps, one per-bin measurement. Medians."""
    data, sched = load_dataset(dataset, 297 if dataset == "digits" else 32), make_scheduler()
    base = dict(preset=preset, dataset=dataset, batch_size=32, eval_size=data.info.eval_size)
    g_on = _trainer(TrialConfig(**base, micro_batch_size=16, gns=True), data, sched)[1]
    g_off = _trainer(TrialConfig(**base, micro_batch_size=16, gns=False), data, sched)[1]
    unsplit = _trainer(TrialConfig(**base, micro_batch_size=32, gns=False, gns_every=0), data, sched)[1]
    cfg1 = TrialConfig(**base, micro_batch_size=32, gns=True, gns_every=gns_every, gns_bin_examples=bin_examples)
    model, step1 = _trainer(cfg1, data, sched)
    bins = BinGNS(cfg1, model, data, sched, 0, 1, CPU, contextlib.nullcontext)
    t_on, t_off, t_step, t_one, t_measure = [], [], [], [], []
    s = 0
    for _ in range(1 + reps):  # the first repetition warms up and is dropped
        on = [g_on(s + i) for i in range(steps)]
        off = [g_off(s + i) for i in range(steps)]
        halves = [step1(s + i) for i in range(steps)]  # A = 1, gns_halves (the default): two backward passes
        one = [unsplit(s + i) for i in range(steps)]  # A = 1, one backward, no global GNS
        t0 = clock()
        bins.measure(s)
        meas = clock() - t0
        s += steps
        if _:
            t_on += on
            t_off += off
            t_step += halves
            t_one += one
            t_measure.append(meas)
    m_on, m_off, m_step, m_one, m_meas = (statistics.median(x) for x in (t_on, t_off, t_step, t_one, t_measure))
    return {
        "preset": preset,
        "global_on_s": m_on,
        "global_off_s": m_off,
        "global_ratio": m_on / m_off,
        "step_s": m_step,
        "unsplit_s": m_one,
        "halves_ratio": m_step / m_one,
        "measure_s": m_meas,
        "measure_in_steps": m_meas / m_step,
        "per_bin_ratio": (m_step + m_meas / gns_every) / m_step,
        "gns_every": gns_every,
        "bin_examples": cfg1.bin_examples,
        "bins": cfg1.timestep_bins,
    }


def main() -> None:
    defaults = TrialConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", nargs="+", default=["tiny", "DiT-S/2"])
    p.add_argument("--dataset", default="digits")
    p.add_argument("--reps", type=int, default=7, help="interleaved repetitions (medians over them)")
    p.add_argument("--steps", type=int, default=10, help="training steps per repetition and variant")
    p.add_argument("--gns-every", type=int, default=defaults.gns_every or 250)
    p.add_argument("--bin-examples", type=int, default=defaults.gns_bin_examples)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="what a step's time is (default: cpu)")
    args = p.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    print(
        f"dataset {args.dataset}, B=32, {args.threads} thread(s), reps {args.reps} x {args.steps} steps, medians, "
        f"{args.clock} clock"
    )
    head = f"{'preset':8s} {'global on/off (A=2)':>22s} {'ratio':>7s} {'A=1 halves/one':>22s} {'ratio':>7s}"
    head += f" {'measure':>8s}"
    print(head + f" {'= steps':>8s} {'every':>6s} {'per-bin ratio':>14s}")
    for preset in args.presets:
        r = bench_preset(preset, args.dataset, args.reps, args.steps, args.gns_every, args.bin_examples)
        print(
            f"{r['preset']:8s} {r['global_on_s'] * 1e3:9.1f} / {r['global_off_s'] * 1e3:7.1f} ms "
            f"{r['global_ratio']:7.4f} {r['step_s'] * 1e3:9.1f} / {r['unsplit_s'] * 1e3:7.1f} ms "
            f"{r['halves_ratio']:7.4f} "
            f"{r['measure_s']:7.2f}s {r['measure_in_steps']:8.1f} "
            f"{r['gns_every']:6d} {r['per_bin_ratio']:14.4f}   (K={r['bins']}, n={r['bin_examples']}/bin)",
            flush=True,
        )


if __name__ == "__main__":
    main()
