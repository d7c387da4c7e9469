"""What every dataset source of the trial shares (`trainables.data.datasets` opens them; the packed store of
`trainables.data.latent_store` reads and writes one): the `Dataset` interface, its `DatasetError` and shape
facts, and the checked readers of fast-DiT latent files (float32 ``(1, 4, 32, 32)`` features, int64 ``(1,)``
labels)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from analysis.core.bcrit_error import BcritError
from trainables.exc_chain import exception_in_chain

LATENT_SHAPE = (1, 4, 32, 32)  # one fast-DiT feature file
FOLDER_CLASSES = 1000  # fast-DiT ImageNet labels


class DatasetError(BcritError):
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


def latent_files(root: str) -> tuple[list[str], list[str]]:
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
