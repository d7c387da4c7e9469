"""Host input cost per example, side by side in one run: the latent folder vs the packed store, and the draws.

A synthetic fast-DiT folder (``--n`` latents, float32 ``(1, 4, 32, 32)``, standard normal) is written and packed
(float32, float16, bfloat16); then, for ``--reps`` interleaved repetitions of random global batches of ``--batch``
indices (warm page cache), the median time per example of:

- **old path**: the loader before this change (one unchecked ``np.load`` per feature and per label file, then
  ``np.stack``) plus the old per-example noise draws (``example_draws``, kept in tests/oracles/example_draws.py: a CPU
  generator re-seeded per example) -- what a step paid per example before;
- **folder**: today's folder loader (every file read is checked);
- **store float32 / float16 / bfloat16**: one memory-map gather (`Dataset.gather`) plus the cast to float32;
- **draws**: old per-example ``example_draws`` vs new ``step_draws`` (one generator, three calls per global batch).

Ratios are old / new. The precision loss of each storage dtype is the manifest's measured relative error.
``--clock cpu`` (default) times CPU seconds of this process (user + system, so file reads count), robust on a
shared machine where wall time mostly measures waiting for a core; ``--clock wall`` on an idle machine.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_input_pipeline.py --n 8192 --batch 256 --reps 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import torch

from tests.oracles.example_draws import example_draws
from trainables.data import load_dataset
from trainables.data.base import latent_files
from trainables.data.latent_store import pack
from trainables.diffusion import NUM_TIMESTEPS
from trainables.randomness import STREAM_EXAMPLE, step_draws

SHAPE = (4, 32, 32)


def make_folder(root: str, n: int) -> None:
    os.makedirs(os.path.join(root, "imagenet256_features"))
    os.makedirs(os.path.join(root, "imagenet256_labels"))
    rng = np.random.default_rng(0)
    for i in range(n):
        np.save(os.path.join(root, "imagenet256_features", f"{i}.npy"), rng.standard_normal((1, *SHAPE), np.float32))
        np.save(os.path.join(root, "imagenet256_labels", f"{i}.npy"), np.array([i % 1000], np.int64))


def old_loader(root: str):
    """The folder loader as it was: np.load per file, no checks."""
    feats, labs = latent_files(root)

    def load(idx):
        x = np.stack([np.load(feats[i])[0] for i in idx])
        y = np.array([int(np.load(labs[i])[0]) for i in idx], dtype=np.int64)
        return torch.from_numpy(x), torch.from_numpy(y)

    return load


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = time.process_time


def timed(fn) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192, help="latents in the synthetic folder")
    ap.add_argument("--batch", type=int, default=256, help="global batch size")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dir", default=None, help="where to build the folder and stores (default: a temp dir)")
    ap.add_argument("--clock", choices=list(CLOCKS), default="cpu")
    args = ap.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = os.path.join(tmp, "lat")
        t0 = time.perf_counter()
        make_folder(folder, args.n)
        print(f"folder of {args.n} latents written in {time.perf_counter() - t0:.1f} s", flush=True)
        stores, errors = {}, {}
        for dtype in ("float32", "float16", "bfloat16"):
            t0 = time.perf_counter()
            m = pack(folder, os.path.join(tmp, dtype), dtype=dtype, progress=False)
            errors[dtype] = m["rel_error"]
            stores[dtype] = load_dataset(os.path.join(tmp, dtype), 16)
            print(f"packed {dtype} in {time.perf_counter() - t0:.1f} s, relative error {m['rel_error']:.2e}")
        old, folder_ds = old_loader(folder), load_dataset(folder, 16)
        n_train, B = folder_ds.info.train_size, args.batch
        cases = {
            "old path (load + per-example draws)": lambda idx, s: (
                old(idx),
                example_draws(0, STREAM_EXAMPLE, s, range(B), SHAPE, NUM_TIMESTEPS),
            ),
            "folder (checked np.load per file)": lambda idx, s: folder_ds.get(idx),
            **{f"store {d}": lambda idx, s, ds=ds: ds.get(idx) for d, ds in stores.items()},
            "draws old (per-example generator)": lambda idx, s: example_draws(
                0, STREAM_EXAMPLE, s, range(B), SHAPE, NUM_TIMESTEPS
            ),
            "draws new (step_draws, one generator)": lambda idx, s: step_draws(0, s, B, SHAPE, NUM_TIMESTEPS),
        }
        rng = np.random.default_rng(1)
        for fn in cases.values():  # warm the page cache and the code paths
            fn(rng.choice(n_train, B, replace=False), 0)
        times: dict[str, list[float]] = {k: [] for k in cases}
        for r in range(args.reps):
            idx = rng.choice(n_train, B, replace=False)
            for k, fn in cases.items():
                times[k].append(timed(lambda fn=fn, idx=idx, r=r: fn(idx, r)) / B * 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nglobal batch {B}, {args.reps} interleaved repetitions, median {args.clock} us per example (warm cache):")
    for k, v in med.items():
        print(f"  {k:40s} {v:9.2f} us")
    old_k, folder_k = "old path (load + per-example draws)", "folder (checked np.load per file)"
    new_total = med["store float32"] + med["draws new (step_draws, one generator)"]
    print(f"\nfolder / store float32 gather:         {med[folder_k] / med['store float32']:.1f}x")
    print(f"folder / store bfloat16 gather:        {med[folder_k] / med['store bfloat16']:.1f}x")
    print(
        f"draws old / new:                       "
        f"{med['draws old (per-example generator)'] / med['draws new (step_draws, one generator)']:.1f}x"
    )
    print(f"old path / (store float32 + new draws): {med[old_k] / new_total:.1f}x  ({new_total:.2f} us per example)")
    print("relative error of the storage dtype: " + ", ".join(f"{d} {e:.2e}" for d, e in errors.items()))


if __name__ == "__main__":
    main()
