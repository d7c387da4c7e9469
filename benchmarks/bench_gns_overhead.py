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
- **adaLN-gradient GNS** (``--adaln``, config ``gns_adaln``): the step with the modulation linears' hooks
  (``trainables.gns_adaln``) and its window update vs the same step without, every step, global GNS off, at
  ``A = 1`` and ``A = 2``. Target <= 1%.
- **does it track** (``--track``): one trial (``run_local``) with the full-model GNS at every step (global
  ``halves`` with ``--micro 32``, ``micro-batches`` with ``--micro 16``; per bin every ``--gns-every`` steps) and the
  adaLN-gradient GNS; prints, at every report, ``gns/adaln/b_simple / gns/b_simple`` and per bin the same ratio at
  the steps both are logged, and writes the rows as JSON (``--out``) for RESULTS.md.

Presets: ``tiny`` and ``DiT-S/2`` shapes on the shipped 8x8 digits (16 tokens; CPU), or any fast-DiT latent
folder with ``--dataset``. One torch thread (the trial's default ``cpus_per_worker=1``).

    .venv/bin/python benchmarks/bench_gns_overhead.py --presets tiny DiT-S/2 --reps 7
    .venv/bin/python benchmarks/bench_gns_overhead.py --adaln --presets tiny DiT-S/2 --reps 7
    .venv/bin/python benchmarks/bench_gns_overhead.py --track --presets tiny --max-steps 600 --gns-every 20
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from analysis.core.gns_pairs import AdaLNWindows
from trainables.config import TrialConfig
from trainables.data import load_dataset
from trainables.diffusion import make_scheduler
from trainables.gns_adaln import AdaLNCollector
from trainables.gns_bins import BinGNS
from trainables.presets import build_dit
from trainables.step import TrainStep

CPU = torch.device("cpu")
# --clock cpu (default): CPU seconds of this process, robust on a shared machine where wall time mostly measures
# waiting for a core; with one torch thread it is the step's compute. --clock wall for an idle machine.
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = time.process_time


def _trainer(cfg: TrialConfig, data, sched, adaln: bool = False):
    """A fresh model, optimizer and ``TrainStep`` (with the adaLN-gradient collection and its windows when
    ``adaln``); returns ``(model, one_step)``."""
    info = data.info
    torch.manual_seed(cfg.seed)
    model = build_dit(cfg.preset, sample_size=info.image_size, in_channels=info.channels, num_classes=info.num_classes)
    model = model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    col = AdaLNCollector(model, cfg.timestep_bins, CPU) if adaln else None
    windows = AdaLNWindows(cfg.timestep_bins, cfg.gns_steps, cfg.gns_window_half) if adaln else None
    train_step = TrainStep(cfg, model, model, data, sched, 0, 1, CPU, contextlib.nullcontext, adaln=col)

    def one_step(step: int) -> float:
        t0 = clock()
        s = train_step(step)
        if windows is not None:
            windows.update(step + 1, s.adaln)
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


def bench_adaln(preset: str, dataset: str, reps: int, steps: int) -> list[dict]:
    """Interleaved repetitions of the step with and without the adaLN-gradient collection, A = 1 and A = 2. Medians."""
    data, sched = load_dataset(dataset, 297 if dataset == "digits" else 32), make_scheduler()
    base = dict(preset=preset, dataset=dataset, batch_size=32, eval_size=data.info.eval_size, gns=False, gns_every=0)
    out = []
    for micro in (32, 16):
        cfg = TrialConfig(**base, micro_batch_size=micro)
        on, off = _trainer(cfg, data, sched, adaln=True)[1], _trainer(cfg, data, sched)[1]
        t_on, t_off, s = [], [], 0
        for rep in range(1 + reps):  # the first repetition warms up and is dropped
            a = [on(s + i) for i in range(steps)]
            b = [off(s + i) for i in range(steps)]
            s += steps
            if rep:
                t_on += a
                t_off += b
        m_on, m_off = statistics.median(t_on), statistics.median(t_off)
        out.append({"preset": preset, "accum": cfg.accum, "on_s": m_on, "off_s": m_off, "ratio": m_on / m_off})
    return out


def track(
    preset: str, dataset: str, max_steps: int, micro: int, gns_every: int, out: str | None, batch: int = 32,
    bin_examples: int = 32, lr: float | None = None, warmup: int = 0, checkpoint: str | None = None,
) -> None:  # fmt: skip
    """One trial with every GNS on; the adaLN-gradient B over the full-model B_simple, globally and per bin.
    ``checkpoint``: a directory for the trial's final checkpoint (for ``bcrit probe``)."""
    import json

    from analysis.core import metrics as M
    from trainables.trial import run_local

    cfg = TrialConfig(
        preset=preset, dataset=dataset, batch_size=batch, micro_batch_size=micro, max_steps=max_steps,
        eval_every=gns_every, gns_global_every=1, gns_every=gns_every, gns_bin_examples=bin_examples,
        timestep_bins=10, warmup_steps=warmup, **({"lr": lr} if lr is not None else {}),
    )  # fmt: skip
    session = run_local(cfg, checkpoint_root=checkpoint)
    rows: dict[str, dict[int, float]] = {}
    for rep in session.reports:
        for step, _examples, name, value, *_clocks in rep["rows"]:
            if "b_simple" in name:
                rows.setdefault(name, {})[int(step)] = float(value)
    if out:
        with open(out, "w") as f:
            json.dump({"config": cfg.to_dict(), "rows": rows}, f)
    bins = range(cfg.timestep_bins)
    print(f"{preset}, B={batch}, micro {micro} ({cfg.global_gns}), lr {cfg.lr:g}, per-bin full-model every "
          f"{gns_every} steps ({cfg.bin_examples} examples/bin)")  # fmt: skip
    print(f"{'step':>6s} {'adaLN':>14s} {'full':>14s} {'ratio':>6s}   per-bin ratio adaLN / full, bins 0..9")
    a, f = rows.get(M.GNS_ADALN_B_SIMPLE, {}), rows.get(M.GNS_B_SIMPLE, {})
    for step in sorted(set(a) & set(f)):
        per = []
        for k in bins:
            ab = rows.get(M.per_bin(M.GNS_ADALN_BIN_B_SIMPLE, k), {}).get(step)
            fb = rows.get(M.per_bin(M.GNS_BIN_B_SIMPLE, k), {}).get(step)
            per.append(f"{ab / fb:5.2f}" if ab and fb else "    -")
        ase, fse = rows[M.GNS_ADALN_B_SIMPLE_SE][step], rows[M.GNS_B_SIMPLE_SE][step]
        head = f"{step:6d} {a[step]:7.2f}±{ase:5.2f} {f[step]:7.2f}±{fse:5.2f} {a[step] / f[step]:6.2f}   "
        print(head + " ".join(per))


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
    p.add_argument("--adaln", action="store_true", help="adaLN-gradient GNS on vs off instead (global GNS off)")
    p.add_argument("--track", action="store_true", help="adaLN-gradient B_simple against the full model's, one trial")
    p.add_argument("--max-steps", type=int, default=600, help="--track: the trial's steps")
    p.add_argument("--micro", type=int, default=32, help="--track: micro-batch (= --batch: halves; half: A = 2)")
    p.add_argument("--batch", type=int, default=32, help="--track: the trial's batch size B")
    p.add_argument("--lr", type=float, default=None, help="--track: peak learning rate (default: the config's)")
    p.add_argument("--warmup", type=int, default=0, help="--track: linear warm-up steps")
    p.add_argument("--checkpoint", default=None, help="--track: keep the final checkpoint here (for bcrit probe)")
    p.add_argument("--out", default=None, help="--track: write the B_simple rows here (JSON)")
    args = p.parse_args()
    if args.track:
        torch.set_num_threads(args.threads)
        for preset in args.presets:
            track(preset, args.dataset, args.max_steps, args.micro, args.gns_every, args.out, args.batch,
                  args.bin_examples, args.lr, args.warmup, args.checkpoint)  # fmt: skip
        return
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    if args.adaln:
        print(f"dataset {args.dataset}, B=32, {args.threads} thread(s), reps {args.reps} x {args.steps} steps, medians")
        print(f"{'preset':8s} {'A':>2s} {'adaLN on / off':>24s} {'ratio':>7s}")
        for preset in args.presets:
            for r in bench_adaln(preset, args.dataset, args.reps, args.steps):
                print(f"{r['preset']:8s} {r['accum']:2d} {r['on_s'] * 1e3:10.2f} / {r['off_s'] * 1e3:8.2f} ms "
                      f"{r['ratio']:7.4f}", flush=True)  # fmt: skip
        return
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
