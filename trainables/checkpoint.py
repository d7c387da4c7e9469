"""Trial checkpoints: everything needed to continue exactly, stored as data that loads without running code.

One checkpoint directory: ``state.pt`` (rank 0: model, optimizer, LR scheduler, EMA, GNS smoothing state, counters,
first eval loss, training seconds, the trial config) and ``rng_rank{r}.pt`` (every rank: its torch, numpy and python
RNG states). The data position is the step counter: batches are a pure function of ``(seed, step)`` (randomness.py).

**Data, not code** (docs/security.md): both files hold only tensors, plain containers, numbers, strings, booleans and
None, so every reader uses ``torch.load(..., weights_only=True)``, which refuses any other Python global. `save`
converts what is not data yet (numpy arrays, scalars, the numpy RNG state) and refuses, naming the key, what it
cannot. `read` is the one reader of ``state.pt``: a file holding Python objects (an older bcrit's checkpoint, a
crafted file) is refused with `UnsafeCheckpoint`, nothing in it run. ``bcrit migrate-checkpoint OLD NEW --trust``
(`migrate`) converts a checkpoint the user trusts: the only place bcrit unpickles a checkpoint fully."""

from __future__ import annotations

import collections
import dataclasses
import enum
import os
import pickle
import random
import re
import shutil
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from trainables.config import ConfigError

STATE_FILE = "state.pt"
MIGRATE_HINT = "bcrit migrate-checkpoint OLD NEW --trust"
_NP_RNG = "__numpy_rng__"  # marks the numpy RNG state (a tuple holding an array) stored as a dict


class UnsafeCheckpoint(ConfigError):
    """A checkpoint file that holds Python objects (code to run on load), refused unopened: one line naming it."""


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


# --- conversion to data ---------------------------------------------------------------------------------------
def to_data(obj: Any, where: str = "state") -> Any:
    """``obj`` with every leaf a tensor, number, string, bool or None (containers: dict, list, tuple). Containers
    whose leaves are data already are returned as they are (a module ``state_dict`` keeps its ``_metadata``).
    Raises TypeError naming ``where`` (the key path) for a value with no data form."""
    if isinstance(obj, np.generic):  # before float: np.float64 is a float subclass, but pickles as numpy's
        return obj.item()
    if isinstance(obj, enum.Enum):  # before int/str: an IntEnum or StrEnum pickles as its class
        return to_data(obj.value, where)
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor, torch.dtype, torch.device, torch.Size)):
        return obj
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "biuf" and obj.dtype.itemsize <= 8:
            return torch.from_numpy(np.ascontiguousarray(obj).copy())
        return to_data(obj.tolist(), where)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_data(dataclasses.asdict(obj), where)
    if isinstance(obj, Mapping):
        items = {k: to_data(v, f"{where}[{k!r}]") for k, v in obj.items()}
        if all(items[k] is v for k, v in obj.items()) and type(obj) in (dict, collections.OrderedDict):
            return obj
        return {(k.item() if isinstance(k, np.generic) else k): v for k, v in items.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        seq = sorted(obj) if isinstance(obj, (set, frozenset)) else obj
        out = [to_data(v, f"{where}[{i}]") for i, v in enumerate(seq)]
        if type(obj) in (list, tuple) and all(a is b for a, b in zip(out, seq, strict=True)):
            return obj
        return tuple(out) if isinstance(obj, tuple) else out
    raise TypeError(f"checkpoint value {where} is a {type(obj).__name__}, which has no data form; store it as tensors")


def rng_state() -> dict:
    """This process's RNG states, as data."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy": _numpy_rng(np.random.get_state()),  # noqa: NPY002 (the legacy global RNG is what we save)
        "python": random.getstate(),  # (version, tuple of ints, None): data already
    }


def _numpy_rng(state: tuple) -> dict:
    """``np.random.get_state()``'s tuple (it holds a uint32 array) as data."""
    kind, key, pos, has_gauss, cached = state
    key = torch.from_numpy(np.asarray(key).astype(np.int64))
    return {_NP_RNG: kind, "key": key, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def set_rng_state(rng: Mapping[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    n = rng["numpy"]
    key = np.asarray(n["key"].numpy() if isinstance(n["key"], torch.Tensor) else n["key"]).astype(np.uint32)
    np.random.set_state((n[_NP_RNG], key, n["pos"], n["has_gauss"], n["cached_gaussian"]))  # noqa: NPY002
    random.setstate(rng["python"])


# --- save and load --------------------------------------------------------------------------------------------
def save(directory: str, rank: int, state: dict | None) -> None:
    os.makedirs(directory, exist_ok=True)
    if state is not None:
        torch.save(to_data(state), os.path.join(directory, STATE_FILE))
    torch.save(rng_state(), os.path.join(directory, rng_file(rank)))


def read(path: str, *, mmap: bool = False) -> Any:
    """The contents of a checkpoint file, loaded as data only (``weights_only=True``). A file holding Python
    objects raises `UnsafeCheckpoint`, naming it, why, and the way out; nothing in it is run. Other failures
    (missing, truncated) propagate as they are."""
    archive = zipfile.is_zipfile(path)
    mmap = mmap and archive  # a legacy (plain pickle) file cannot be mapped: read it, as data too
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if not archive and "GLOBAL" not in str(e):  # torch.save writes a zip archive: a truncated one is not a zip,
            raise  # and its bytes read as a bad pickle -- damaged, not unsafe (the caller says so)
        raise UnsafeCheckpoint(
            f"{path} holds Python objects, not only data ({_refused_global(e)}): refused unopened, nothing in it was "
            f"run. A checkpoint of an older bcrit? If you trust its source, convert it: `{MIGRATE_HINT}` "
            "(docs/security.md)"
        ) from None


def _refused_global(e: Exception) -> str:
    """The short reason in a weights-only unpickler error (the global it refused, when it names one)."""
    text = str(e)
    m = re.search(r"GLOBAL ([\w.]+)", text)
    if m:
        return f"it names the Python global {m.group(1)}"
    for line in text.splitlines()[1:]:
        line = line.strip().removeprefix("WeightsUnpickler error:").strip()
        if line and not line.startswith(("Please", "Check the documentation", "(1)", "(2)")):
            return line[:120]
    return "not a weights-only file"


def load(directory: str, rank: int) -> dict:
    """The rank-0 state, after restoring this rank's RNG states (when the checkpoint has them)."""
    path = os.path.join(directory, STATE_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{directory} is not a bcrit trial checkpoint (no {STATE_FILE})")
    state = read(path)
    rng_path = os.path.join(directory, rng_file(rank))
    if os.path.exists(rng_path):
        set_rng_state(read(rng_path))
    return state


# --- migration of trusted old checkpoints ---------------------------------------------------------------------
def migrate(old: str, new: str) -> list[str]:
    """Convert the checkpoint directory ``old``, trusted by the caller, into ``new`` (which must not exist) in the
    data format; returns the names of the files fully unpickled to do so. A ``*.pt`` file that loads as data already
    is not unpickled; other files are copied as they are. ``new`` is complete or absent (written under a temporary
    name, then renamed)."""
    if not os.path.isfile(os.path.join(old, STATE_FILE)):
        raise FileNotFoundError(f"{old} is not a bcrit trial checkpoint directory (no {STATE_FILE})")
    tmp = f"{new.rstrip(os.sep)}.tmp-{os.getpid()}"
    os.makedirs(tmp)
    unpickled = []
    try:
        for name in sorted(os.listdir(old)):
            src, dst = os.path.join(old, name), os.path.join(tmp, name)
            if not os.path.isfile(src):
                continue
            if not name.endswith(".pt"):
                shutil.copy2(src, dst)
                continue
            try:
                obj = read(src)
            except UnsafeCheckpoint:
                obj = torch.load(src, map_location="cpu", weights_only=False)  # the one full unpickle: --trust
                unpickled.append(name)
            if re.fullmatch(r"rng_rank\d+\.pt", name):
                obj = _rng_as_data(obj)
            torch.save(to_data(obj, name), dst)
            read(dst)  # what every reader does: it must load as data now
        os.rename(tmp, new)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return unpickled


def _rng_as_data(rng: Mapping[str, Any]) -> dict:
    n = rng["numpy"]
    return {**rng, "numpy": _numpy_rng(n) if isinstance(n, tuple) else n}  # a tuple: the old format
