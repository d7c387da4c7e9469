"""A packed latent store: a fast-DiT feature folder as one contiguous, memory-mappable array.

Layout of a store directory (``bcrit pack-latents FOLDER OUT``):
- ``latents.npy``: ``(N, 4, 32, 32)`` in the storage dtype: ``float32`` (exact), ``float16`` or ``bfloat16``
  (numpy has no bfloat16: stored as the raw ``uint16`` bits); a plain ``.npy`` file, ``np.load(mmap_mode="r")``.
- ``labels.npy``: ``(N,)`` int64 class ids in ``0..num_classes-1``.
- ``manifest.json``: format, version, count, shape, storage dtype, class count, source folder, the relative error
  of the storage dtype measured over every element (``sqrt(sum (x_q - x)^2 / sum x^2)``, float64), and
  ``rows_done`` / ``complete`` (a killed pack continues from ``rows_done``).
Rows keep the folder's sorted order, so a store holds the same examples at the same indices as its folder (the
last ``eval_size`` rows are held out). Trials gather rows by index; the OS page cache is shared by every worker
of a node. Opening a store checks the manifest, both arrays' headers and every label (cheap: one array).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import numpy as np

from trainables.data.base import (
    FOLDER_CLASSES,
    LATENT_SHAPE,
    Dataset,
    DatasetError,
    DatasetInfo,
    latent_files,
    read_label,
    read_latent,
)

FORMAT, VERSION = "bcrit-latents", 1
MANIFEST, LATENTS, LABELS = "manifest.json", "latents.npy", "labels.npy"
ROW_SHAPE = LATENT_SHAPE[1:]  # (4, 32, 32)
STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}  # on-disk numpy dtype
FLOAT16_MAX = 65504.0


def is_store(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MANIFEST))


def read_manifest(root: str) -> dict:
    path = os.path.join(root, MANIFEST)
    try:
        with open(path) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: unreadable manifest ({e}); re-run bcrit pack-latents") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("version") != VERSION:
        raise DatasetError(f"{path}: not a {FORMAT} v{VERSION} manifest; re-run bcrit pack-latents")
    return m


def _write_manifest(root: str, m: dict) -> None:
    tmp = os.path.join(root, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(m, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(root, MANIFEST))  # atomic: a kill leaves the old or the new manifest


def to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 rows -> the on-disk representation of ``dtype`` (round to nearest even)."""
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16)
    import torch

    return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def from_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """On-disk rows -> float32."""
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32)  # bf16 bits are the top half of a float32
    return x.astype(np.float32, copy=False)


def pack(
    folder: str,
    out: str,
    dtype: str = "float32",
    num_classes: int = FOLDER_CLASSES,
    chunk: int = 1024,
    progress: bool = True,
    on_chunk: Callable[[int], None] | None = None,
) -> dict:
    """Pack ``folder`` into the store ``out`` and return its manifest; continues a killed pack of the same
    ``folder``/``dtype``. Every file is checked (shape, dtype, label range); a bad one raises one `DatasetError`
    line naming it. ``on_chunk(rows_done)`` is called after each committed chunk (tests interrupt through it)."""
    if dtype not in STORAGE:
        raise DatasetError(f"storage dtype {dtype!r} unknown; choose one of {list(STORAGE)}")
    if num_classes < 1:
        raise DatasetError(f"num_classes must be >= 1, got {num_classes}")
    feats, labs = latent_files(folder)
    for f, lab in zip(feats, labs, strict=True):
        if os.path.basename(f) != os.path.basename(lab):
            raise DatasetError(f"{f} has no label file of the same name (found {lab}); the folders must pair up")
    n = len(feats)
    want = {
        "format": FORMAT,
        "version": VERSION,
        "count": n,
        "shape": list(ROW_SHAPE),
        "dtype": dtype,
        "num_classes": num_classes,
        "source": os.path.abspath(folder),
        "first": os.path.basename(feats[0]),
        "last": os.path.basename(feats[-1]),
    }
    m = _resume_or_start(out, want)
    if m.get("complete"):
        return m
    done = int(m["rows_done"])
    mode = "r+" if done else "w+"
    xs = np.lib.format.open_memmap(os.path.join(out, LATENTS), mode, STORAGE[dtype], (n, *ROW_SHAPE))
    ys = np.lib.format.open_memmap(os.path.join(out, LABELS), mode, np.int64, (n,))
    if xs.shape != (n, *ROW_SHAPE) or ys.shape != (n,):
        raise DatasetError(f"{out}: partial arrays do not match the manifest; delete {out} and pack again")
    bar = _progress(n, done, progress, f"pack {os.path.basename(os.path.abspath(folder))} -> {dtype}")
    try:
        while done < n:
            stop = min(n, done + chunk)
            x = np.stack([read_latent(feats[i])[0] for i in range(done, stop)])  # (rows, 4, 32, 32) float32
            y = np.array([read_label(labs[i], num_classes) for i in range(done, stop)], dtype=np.int64)
            q = to_storage(x, dtype)
            if dtype == "float16" and np.abs(x).max() > FLOAT16_MAX:
                raise DatasetError(f"{feats[done]}..: values beyond float16's range {FLOAT16_MAX}; pack as bfloat16")
            x64 = x.astype(np.float64)
            m["sum_sq"] += float(np.square(x64).sum())
            m["sum_sq_err"] += float(np.square(from_storage(q, dtype).astype(np.float64) - x64).sum())
            xs[done:stop], ys[done:stop] = q, y
            xs.flush()
            ys.flush()
            done = m["rows_done"] = stop
            m["rel_error"] = (m["sum_sq_err"] / m["sum_sq"]) ** 0.5 if m["sum_sq"] > 0 else 0.0
            _write_manifest(out, m)  # commit point: rows below rows_done are on disk
            bar.update(stop - bar.n)
            if on_chunk is not None:
                on_chunk(done)
    finally:
        bar.close()
    del xs, ys
    m["complete"] = True
    _write_manifest(out, m)
    return m


def _resume_or_start(out: str, want: dict) -> dict:
    """The manifest to continue from: a partial pack of the same source, or a fresh one (written at once)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise DatasetError(f"{out} is a file; give a directory for the store")
    if os.path.isdir(out) and is_store(out):
        m = read_manifest(out)
        differs = [k for k, v in want.items() if m.get(k) != v]
        if differs:
            raise DatasetError(
                f"{out} already holds a store packed with other settings ({', '.join(differs)}); "
                "choose another OUT or delete it"
            )
        return m
    if os.path.isdir(out) and os.listdir(out):
        raise DatasetError(f"{out} exists and is not a latent store; choose an empty or new directory")
    os.makedirs(out, exist_ok=True)
    m = {**want, "rows_done": 0, "complete": False, "sum_sq": 0.0, "sum_sq_err": 0.0, "rel_error": 0.0}
    _write_manifest(out, m)
    return m


def _progress(total: int, initial: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, unit="latent", file=sys.stderr)


def open_store(root: str, eval_size: int) -> Dataset:
    """A packed store as a `Dataset` (memory-mapped; the last ``eval_size`` rows held out). Checks the
    manifest, both array headers and every label; each problem is one `DatasetError` line."""
    m = read_manifest(root)
    n, dtype, k = int(m["count"]), m["dtype"], int(m["num_classes"])
    if not m.get("complete"):
        raise DatasetError(
            f"{root} is a partial pack ({m.get('rows_done', 0)} of {n} rows); finish it with "
            f"bcrit pack-latents {m.get('source', 'FOLDER')} {root}"
        )
    if dtype not in STORAGE:
        raise DatasetError(f"{root}: storage dtype {dtype!r} unknown; re-run bcrit pack-latents")
    try:
        xs = np.load(os.path.join(root, LATENTS), mmap_mode="r")
        ys = np.load(os.path.join(root, LABELS))
    except (OSError, ValueError, EOFError) as e:
        raise DatasetError(f"{root}: unreadable store array ({e}); re-run bcrit pack-latents") from None
    if xs.shape != (n, *ROW_SHAPE) or xs.dtype != STORAGE[dtype]:
        raise DatasetError(
            f"{root}/{LATENTS}: shape {xs.shape} dtype {xs.dtype}, manifest says ({n}, 4, 32, 32) {dtype}; "
            "re-run bcrit pack-latents"
        )
    if ys.shape != (n,) or ys.dtype != np.int64:
        raise DatasetError(f"{root}/{LABELS}: shape {ys.shape} dtype {ys.dtype}, expected ({n},) int64")
    bad = np.flatnonzero((ys < 0) | (ys >= k))
    if len(bad):
        raise DatasetError(f"{root}/{LABELS}: label {int(ys[bad[0]])} at row {int(bad[0])} is outside 0..{k - 1}")
    if not 0 < eval_size < n:
        raise DatasetError(f"eval_size must be in 1..{n - 1} for {root} ({n} latents), got {eval_size}")
    n_train = n - eval_size

    def load(split, idx):
        rows = idx if split == "train" else idx + n_train
        return xs[rows], ys[rows]  # one gather each: (n, 4, 32, 32) storage dtype, (n,)

    info = DatasetInfo(root, n_train, eval_size, channels=ROW_SHAPE[0], image_size=ROW_SHAPE[1], num_classes=k)
    return Dataset(info, load, storage=dtype)


__all__ = ["LABELS", "LATENTS", "MANIFEST", "STORAGE", "from_storage", "is_store", "open_store", "pack"]
