"""Datasets: index -> (image or latent, label). Each rank loads only the examples it is given.

(a) ``digits``: scikit-learn's 1,797 real 8x8 handwritten digits (10 classes), shipped as ``digits.npz``
    inside this package (no download); pixel values 0..16 mapped to [-1, 1]; a seeded shuffle splits it into
    train and held-out.
(b) a fast-DiT latent folder (chuanyangjin/fast-DiT ``extract_features.py``): ``imagenet256_features/*.npy``
    float32 ``(1, 4, 32, 32)`` and ``imagenet256_labels/*.npy`` int64 ``(1,)``, read in sorted order; the last
    ``eval_size`` files are held out. One ``np.load`` per example per file (~85 us of CPU an example).
(c) a packed latent store (``bcrit pack-latents FOLDER OUT``, `trainables.data.latent_store`): the same examples
    in the same order, one memory-mapped array read by a gather per micro-batch (a few us an example).
"""

from __future__ import annotations

import os
import sys
from importlib import resources

import numpy as np

from trainables.data.base import (
    FOLDER_CLASSES,
    Dataset,
    DatasetError,
    DatasetInfo,
    latent_files,
    read_label,
    read_latent,
)
from trainables.data.latent_store import is_store, open_store

DIGITS_SPLIT_SEED = 20181214  # fixed: the held-out set must not move with the trial seed


def _digits(eval_size: int) -> Dataset:
    with resources.files("trainables.data").joinpath("digits.npz").open("rb") as f:
        npz = np.load(f)
        images, labels = npz["images"], npz["labels"]
    x = (images.astype(np.float32) / 8.0 - 1.0)[:, None]  # (N, 1, 8, 8) in [-1, 1]
    order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(x))
    if not 0 < eval_size < len(x):
        raise DatasetError(f"eval_size must be in 1..{len(x) - 1} for digits, got {eval_size}")
    train, held = order[:-eval_size], order[-eval_size:]
    splits = {"train": (x[train], labels[train]), "eval": (x[held], labels[held])}

    def load(split, idx):
        xs, ys = splits[split]
        return xs[idx], ys[idx]

    info = DatasetInfo("digits", len(train), eval_size, channels=1, image_size=8, num_classes=10)
    return Dataset(info, load)


SPOT_CHECKS = 16  # files checked when a folder is opened, evenly spaced (a full scan of 1.28M files takes minutes)
_hinted: set[str] = set()


def _latents(root: str, eval_size: int) -> Dataset:
    feats, labs = latent_files(root)
    if not 0 < eval_size < len(feats):
        raise DatasetError(f"eval_size must be in 1..{len(feats) - 1} for {root} ({len(feats)} files), got {eval_size}")
    for i in sorted(set(np.linspace(0, len(feats) - 1, SPOT_CHECKS).astype(int).tolist())):
        read_latent(feats[i])
        read_label(labs[i], FOLDER_CLASSES)
    n_train = len(feats) - eval_size

    def load(split, idx):  # every file read is checked: a bad one is named, mid-training too
        off = 0 if split == "train" else n_train
        x = np.stack([read_latent(feats[off + i])[0] for i in idx])  # (n, 4, 32, 32)
        y = np.array([read_label(labs[off + i], FOLDER_CLASSES) for i in idx], dtype=np.int64)
        return x, y

    if root not in _hinted:  # once per process
        _hinted.add(root)
        print(
            f"bcrit: {root} is read one file per example; `bcrit pack-latents {root} OUT` packs it into one "
            "memory-mapped store read with ~35x less CPU time per example (then set dataset: OUT)",
            file=sys.stderr,
            flush=True,
        )
    info = DatasetInfo(root, n_train, eval_size, channels=4, image_size=32, num_classes=FOLDER_CLASSES)
    return Dataset(info, load)


def load_dataset(name: str, eval_size: int) -> Dataset:
    """The dataset named by a config's ``dataset`` key: ``digits``, a packed latent store or a latent folder."""
    if name == "digits":
        return _digits(eval_size)
    if not os.path.isdir(name):
        raise DatasetError(
            f"dataset {name!r} not found: use 'digits', a packed latent store or a fast-DiT latent folder"
        )
    if is_store(name):
        return open_store(name, eval_size)
    return _latents(name, eval_size)


def describe_dataset(name: str, eval_size: int) -> DatasetInfo:
    """Validate a dataset and return its shape facts without loading its examples."""
    return load_dataset(name, eval_size).info
