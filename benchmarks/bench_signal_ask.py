"""What a trial's ask of its sweep's signal actor costs (trainables.sweep_signal.SignalReader, once per evaluation),
with the actor there (the driver creates it at the sweep's start: StopBehind.setup, issue 44) and before it exists
(each ask a failed ``ray.get_actor`` lookup: what trials paid until the sweep's first stop), beside a whole demo
trial: the tiny DiT at B = 128 of examples/tiny.yaml (an evaluation every 2 steps, the demo's densest cadence), run
in this process on a local Ray, once per mode in one run.

    .venv/bin/python benchmarks/bench_signal_ask.py
"""

from __future__ import annotations

import argparse
import statistics
import time


class TimedReader:
    """A SignalReader that times each of its asks."""

    def __init__(self, reader):
        self.reader, self.ms = reader, []

    def __call__(self):
        t0 = time.perf_counter()
        out = self.reader()
        self.ms.append((time.perf_counter() - t0) * 1e3)
        return out


def demo_trial(batch_size: int):
    """The demo's trial config at ``batch_size`` (examples/tiny.yaml, its first lr and seed, no target: full budget)."""
    import yaml

    from trainables.config import TrialConfig

    with open("examples/tiny.yaml") as f:
        spec = yaml.safe_load(f)
    fixed = dict(spec["fixed"])
    fixed.pop("seeds")
    per_b = {k: v[batch_size] if isinstance(v, dict) else v for k, v in fixed.items()}
    stop = spec["stopping"]
    return TrialConfig.from_dict({**per_b, "batch_size": batch_size, "micro_batch_size": batch_size, "lr": 1e-2,
                                  "warmup_steps": 5, "seed": 0, "num_workers": 0,
                                  "max_steps": stop["max_steps"][batch_size]})  # fmt: skip


def run(cfg, reader) -> tuple[float, list[float]]:
    from trainables.loop import train_loop
    from trainables.trial import LocalSession

    session = LocalSession()
    if reader is not None:
        session.sweep_ended = reader
    t0 = time.perf_counter()
    train_loop(cfg, session)
    return time.perf_counter() - t0, (reader.ms if reader is not None else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=128)
    a = ap.parse_args()
    import ray
    import torch

    from trainables.sweep_signal import SignalReader, open_signal

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    cfg = demo_trial(a.batch_size)
    name = "bcrit-goal-bench-signal-ask"
    run(cfg, None)  # warm-up: imports, data
    rows = [("no signal (no sweep)", *run(cfg, None))]
    rows.append(("no actor yet (failed lookup)", *run(cfg, TimedReader(SignalReader(name, "t")))))
    open_signal(name)
    rows.append(("actor there (created at setup)", *run(cfg, TimedReader(SignalReader(name, "t")))))
    ray.shutdown()
    base = rows[0][1]
    print(f"tiny DiT, B = {a.batch_size}, {cfg.max_steps} steps, an evaluation every {cfg.eval_every} steps")
    print("| mode | trial s | asks | median ask ms | asks' share of the trial | trial / no signal |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, wall, ms in rows:
        med = f"{statistics.median(ms):.2f}" if ms else "-"
        print(f"| {label} | {wall:.2f} | {len(ms)} | {med} | {sum(ms) / 1e3 / wall:.4f} | {wall / base:.3f} |")


if __name__ == "__main__":
    main()
