"""Datasets: index -> (image or latent, label). Each rank loads only the examples it is given.

(a) ``digits``: scikit-learn's 1,797 real 8x8 handwritten digits (10 classes), shipped as ``digits.npz``
    inside this package (no download); pixel values 0..16 mapped to [-1, 1]; a seeded shuffle splits it into
    train and held-out.
(b) a fast-DiT latent folder (chuanyangjin/fast-DiT ``extract_features.py``): ``imagenet256_features/*.npy``
    float32 ``(1, 4, 32, 32)`` and ``imagenet256_labels/*.npy`` int64 ``(1,)``, read in sorted order; the last
    ``eval_size`` files are held out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources

import numpy as np
import torch

DIGITS_SPLIT_SEED = 20181214  # fixed: the held-out set must not move with the trial seed
LATENT_SHAPE = (1, 4, 32, 32)


class DatasetError(ValueError):
    """A dataset that is missing or malformed; one line naming the problem and the fix."""


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    train_size: int
    eval_size: int
    channels: int
    image_size: int
    num_classes: int


class Dataset:
    """Train and held-out examples addressed by integer index; ``get`` loads only what is asked for."""

    def __init__(self, info: DatasetInfo, loader):
        self.info = info
        self._loader = loader  # (split, np.ndarray[int]) -> (x float32 [n,C,H,W], y int64 [n])

    def get(self, indices: np.ndarray, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self._loader(split, np.asarray(indices, dtype=np.int64))
        return torch.from_numpy(x), torch.from_numpy(y)


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


def _latent_files(root: str) -> tuple[list[str], list[str]]:
    fdir, ldir = os.path.join(root, "imagenet256_features"), os.path.join(root, "imagenet256_labels")
    for d in (fdir, ldir):
        if not os.path.isdir(d):
            raise DatasetError(
                f"latent folder {root!r} has no {os.path.basename(d)}/; run fast-DiT's extract_features.py"
            )
    feats = sorted(f for f in os.listdir(fdir) if f.endswith(".npy"))
    labs = sorted(f for f in os.listdir(ldir) if f.endswith(".npy"))
    if not feats:
        raise DatasetError(f"{fdir} holds no .npy files")
    if len(feats) != len(labs):
        raise DatasetError(f"{root}: {len(feats)} feature files but {len(labs)} label files; they must pair up")
    return [os.path.join(fdir, f) for f in feats], [os.path.join(ldir, f) for f in labs]


def _check_npy(path: str, shape: tuple, dtype) -> None:
    arr = np.load(path, mmap_mode="r")
    if arr.shape != shape or arr.dtype != dtype:
        raise DatasetError(
            f"{path}: shape {arr.shape} dtype {arr.dtype}, expected {shape} {np.dtype(dtype)} (fast-DiT latents)"
        )


def _latents(root: str, eval_size: int) -> Dataset:
    feats, labs = _latent_files(root)
    if not 0 < eval_size < len(feats):
        raise DatasetError(f"eval_size must be in 1..{len(feats) - 1} for {root} ({len(feats)} files), got {eval_size}")
    for i in sorted({0, len(feats) - 1}):  # spot-check both ends (a full scan of 1.28M headers is too slow)
        _check_npy(feats[i], LATENT_SHAPE, np.float32)
        _check_npy(labs[i], (1,), np.int64)
    n_train = len(feats) - eval_size

    def load(split, idx):
        off = 0 if split == "train" else n_train
        x = np.stack([np.load(feats[off + i])[0] for i in idx])  # (n, 4, 32, 32)
        y = np.array([int(np.load(labs[off + i])[0]) for i in idx], dtype=np.int64)
        return x, y

    num_classes = 1000
    info = DatasetInfo(root, n_train, eval_size, channels=4, image_size=32, num_classes=num_classes)
    return Dataset(info, load)


def load_dataset(name: str, eval_size: int) -> Dataset:
    """The dataset named by a config's ``dataset`` key."""
    if name == "digits":
        return _digits(eval_size)
    if not os.path.isdir(name):
        raise DatasetError(f"dataset {name!r} not found: use 'digits' or a fast-DiT latent folder")
    return _latents(name, eval_size)


def describe_dataset(name: str, eval_size: int) -> DatasetInfo:
    """Validate a dataset and return its shape facts without loading its examples."""
    return load_dataset(name, eval_size).info
