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
from dataclasses import dataclass
from importlib import resources

import numpy as np
import torch

from trainables.exc_chain import exception_in_chain

DIGITS_SPLIT_SEED = 20181214  # fixed: the held-out set must not move with the trial seed
LATENT_SHAPE = (1, 4, 32, 32)


class DatasetError(ValueError):
    """A dataset that is missing or malformed; one line naming the problem and the fix."""


def dataset_error_in(exc: BaseException) -> DatasetError | None:
    """The `DatasetError` behind ``exc``, if any (`trainables.exc_chain`: chained or inside Ray Train's wrappers of
    a worker's exception), so a bad file met by a worker mid-training still reaches the user as its one line."""
    return exception_in_chain(exc, DatasetError)


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    train_size: int
    eval_size: int
    channels: int
    image_size: int
    num_classes: int


class Dataset:
    """Train and held-out examples addressed by integer index; ``get`` loads only what is asked for.

    ``storage`` is the dtype examples are stored in (``float32``, ``float16`` or ``bfloat16``): ``gather`` returns
    them in it (fewer bytes to copy to the device, cast there), ``get`` as float32."""

    def __init__(self, info: DatasetInfo, loader, storage: str = "float32"):
        self.info = info
        self.storage = storage
        self._loader = loader  # (split, np.ndarray[int]) -> (x [n,C,H,W] in storage dtype, y int64 [n])

    def gather(self, indices: np.ndarray, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """``(x (n, C, H, W) in the storage dtype, y (n,) int64)`` as CPU tensors."""
        x, y = self._loader(split, np.asarray(indices, dtype=np.int64))
        x = torch.from_numpy(np.ascontiguousarray(x))
        if self.storage == "bfloat16":
            x = x.view(torch.bfloat16)  # stored as the raw uint16 bits (numpy has no bfloat16)
        return x, torch.from_numpy(np.ascontiguousarray(y))

    def get(self, indices: np.ndarray, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """``(x (n, C, H, W) float32, y (n,) int64)`` as CPU tensors."""
        x, y = self.gather(indices, split)
        return x.float(), y


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


def _check_array(path: str, arr: np.ndarray, shape: tuple, dtype) -> None:
    if arr.shape != shape or arr.dtype != dtype:
        raise DatasetError(
            f"{path}: shape {arr.shape} dtype {arr.dtype}, expected {shape} {np.dtype(dtype)} (fast-DiT latents); "
            "replace or remove the file"
        )


def read_latent(path: str) -> np.ndarray:
    """One fast-DiT feature file, checked: float32 ``(1, 4, 32, 32)``, else one `DatasetError` line naming it."""
    try:
        arr = np.load(path)
    except (OSError, ValueError, EOFError) as e:
        raise DatasetError(f"{path}: not a readable .npy file ({e}); replace or remove it") from None
    _check_array(path, arr, LATENT_SHAPE, np.float32)
    return arr


def read_label(path: str, num_classes: int) -> int:
    """One fast-DiT label file, checked: int64 ``(1,)`` in ``0..num_classes-1``, else one line naming it."""
    try:
        arr = np.load(path)
    except (OSError, ValueError, EOFError) as e:
        raise DatasetError(f"{path}: not a readable .npy file ({e}); replace or remove it") from None
    _check_array(path, arr, (1,), np.int64)
    label = int(arr[0])
    if not 0 <= label < num_classes:
        raise DatasetError(f"{path}: label {label} is outside 0..{num_classes - 1} (ImageNet classes)")
    return label


SPOT_CHECKS = 16  # files checked when a folder is opened, evenly spaced (a full scan of 1.28M files takes minutes)
FOLDER_CLASSES = 1000  # fast-DiT ImageNet labels
_hinted: set[str] = set()


def _latents(root: str, eval_size: int) -> Dataset:
    feats, labs = _latent_files(root)
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
    from trainables.data.latent_store import is_store, open_store

    if is_store(name):
        return open_store(name, eval_size)
    return _latents(name, eval_size)


def describe_dataset(name: str, eval_size: int) -> DatasetInfo:
    """Validate a dataset and return its shape facts without loading its examples."""
    return load_dataset(name, eval_size).info
