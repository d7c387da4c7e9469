"""Offline per-timestep-bin gradient noise scale of a saved trial checkpoint (``bcrit probe``).

Per-bin GNS without the usual estimation mistakes (docs/design.md): for bin ``k`` (and globally, all timesteps)
each repetition draws ``B`` iid examples of the training distribution restricted to the bin, cuts them into
``B/b`` groups of ``b``, and forms ``|G_b|^2`` (mean of the groups' squared norms) and ``|G_B|^2`` (squared norm of
their mean) with the same measurement code as the in-trial ``BinGNS``; the unbiased two-batch estimators of
McCandlish et al. 2018 (arXiv 1812.06162, App. A.1) turn each repetition into ``|G|^2`` and ``tr(Sigma)``. Over
``reps`` independent repetitions: mean and standard error of each (negative ``|G|^2`` draws kept), and
``B_simple = mean(tr) / mean(|G|^2)`` with a delta-method standard error. Training weights by default (the
gradient the optimizer follows), EMA weights on request; every draw from a generator keyed by ``--seed``.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from dataclasses import asdict, dataclass

import torch

from analysis.core.bcrit_error import BcritError
from analysis.core.bins import timestep_bins
from analysis.core.gns import b_simple_with_se, g2_unbiased, mean_with_se, trace_unbiased
from trainables.checkpoint import STATE_FILE, UnsafeCheckpoint, read
from trainables.diffusion import NUM_TIMESTEPS, make_scheduler
from trainables.gns_bins import draw_examples, sub_batch_sq_norms
from trainables.randomness import STREAM_GNS, mix

__all__ = ["DEFAULT_REPS", "ProbeError", "ProbeRow", "format_table", "load_model", "probe", "probe_draws", "probe_row"]

DEFAULT_REPS = 16  # repetitions per bin: enough that the reported SE matches the spread over probe seeds
# (benchmarks/RESULTS.md)
PROBE_TAG = 0x9E0BE  # keeps probe draws apart from the in-trial measurement keys (seed, STREAM_GNS, step, k)


class ProbeError(BcritError):
    """Bad probe input (not a checkpoint, impossible batch sizes, ...): one line naming the problem."""


@dataclass(frozen=True)
class ProbeRow:
    bin: int | None  # None for the global row (all timesteps)
    timesteps: tuple[int, int]  # inclusive
    g2: float
    g2_se: float
    trace: float
    trace_se: float
    b_simple: float
    b_simple_se: float

    def to_json(self) -> dict:
        d = asdict(self)
        d["timesteps"] = list(self.timesteps)
        return d  # the global row has the same fields, with "bin": null


def _check_args(bins: int | None, b: int, B: int, reps: int) -> None:
    if bins is not None and not 1 <= bins <= NUM_TIMESTEPS:
        raise ProbeError(f"--bins must be in 1..{NUM_TIMESTEPS}, got {bins}")
    if b < 1:
        raise ProbeError(f"--b must be >= 1, got {b}")
    if b >= B:
        raise ProbeError(f"need b < B for the two-batch estimators, got b={b}, B={B}")
    if B % b:
        raise ProbeError(f"B={B} must be a multiple of b={b} (equal sub-batches; unequal ones bias tr(Sigma))")
    if reps < 2:
        raise ProbeError(f"--reps must be >= 2 for a standard error, got {reps}")


def load_model(checkpoint: str, ema: bool = False, device: torch.device | None = None):
    """``(cfg, model, data, step)`` from a trial checkpoint directory; ``ema`` loads the EMA weights."""
    from trainables.config import ConfigError, TrialConfig
    from trainables.data import DatasetError, load_dataset
    from trainables.presets import build_dit

    path = os.path.join(checkpoint, STATE_FILE)
    if not os.path.isdir(checkpoint) or not os.path.isfile(path):
        raise ProbeError(f"{checkpoint} is not a bcrit trial checkpoint directory (no {STATE_FILE})")
    try:
        state = read(path)  # data only (docs/security.md); not checkpoint.load: no RNG restore
        cfg = TrialConfig.from_saved(state["config"])
        info = state["dataset_info"]
        weights, step = state["model"], int(state["step"])
    except UnsafeCheckpoint as e:
        raise ProbeError(str(e)) from None
    except ConfigError as e:
        raise ProbeError(f"{checkpoint}: its trial config is unusable here: {e}") from None
    except Exception as e:  # unreadable or foreign state.pt; one line, not torch's multi-line explanation
        got = "not a torch.save archive" if isinstance(e, pickle.UnpicklingError) else f"{type(e).__name__}: {e}"
        raise ProbeError(
            f"{path} is not a readable bcrit checkpoint ({got.splitlines()[0]}): "
            "expected the state.pt a bcrit trial saves (torch.save of its model weights, config and step)"
        ) from None
    try:
        data = load_dataset(cfg.dataset, cfg.eval_size)
    except DatasetError as e:
        raise ProbeError(f"the checkpoint's dataset is unavailable: {e}") from None
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten: leave the caller's RNG alone
        model = build_dit(
            cfg.preset, sample_size=info["image_size"], in_channels=info["channels"], num_classes=info["num_classes"]
        )
    model.load_state_dict(weights)
    if ema:
        if state.get("ema") is None:
            raise ProbeError(f"{checkpoint} has no EMA weights (its trial ran with ema_decay=0); drop --ema")
        from diffusers.training_utils import EMAModel

        shadow = EMAModel(model.parameters())
        shadow.load_state_dict(state["ema"])
        shadow.copy_to(model.parameters())
    model = model.to(device or torch.device("cpu")).train()  # train mode: the loss the optimizer sees
    return cfg, model, data, step


def probe_draws(
    checkpoint: str,
    *,
    bins: int | None = None,
    b: int = 16,
    B: int = 64,
    reps: int = DEFAULT_REPS,
    ema: bool = False,
    seed: int = 0,
) -> tuple[int, list[tuple[int | None, int, int, list[float], list[float]]]]:
    """The probe's raw repetitions: ``(step, [(bin or None, lo, hi, g2 draws, trace draws), ...])``, global last.

    Repetition ``r`` of bin ``k`` is keyed by ``(seed, r, k)``, so the first ``R`` repetitions of a call with
    ``reps >= R`` are exactly those of a call with ``reps = R`` (a study of the SE against ``reps`` can reuse them).
    """
    _check_args(bins, b, B, reps)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg, model, data, step = load_model(checkpoint, ema, dev)
    num_bins = bins or cfg.timestep_bins
    sched = make_scheduler()
    params = [p for p in model.parameters() if p.requires_grad]
    ranges = [(k, lo, hi) for k, (lo, hi) in enumerate(timestep_bins(num_bins, NUM_TIMESTEPS))]
    ranges.append((None, 0, NUM_TIMESTEPS - 1))  # the global row: the full training distribution
    out = []
    for k, lo, hi in ranges:
        key_k = num_bins if k is None else k
        g2s, traces = [], []
        for r in range(reps):
            batch = draw_examples(data, mix(seed, STREAM_GNS, PROBE_TAG, r, key_k), B, lo, hi, cfg.class_dropout)
            small, big = sub_batch_sq_norms(model, params, sched, batch, b, dev)
            g2s.append(float(g2_unbiased(small, big, b, B)))
            traces.append(float(trace_unbiased(small, big, b, B)))
        out.append((k, lo, hi, g2s, traces))
    return step, out


def probe_row(k: int | None, lo: int, hi: int, g2s: list[float], traces: list[float]) -> ProbeRow:
    """Means and SEs of one bin's repetitions (every draw kept, negative ``|G|^2`` ones included)."""
    g2, g2_se = mean_with_se(g2s)
    tr, tr_se = mean_with_se(traces)
    bs, bs_se = b_simple_with_se(g2s, traces)
    return ProbeRow(k, (lo, hi), g2, g2_se, tr, tr_se, bs, bs_se)


def probe(
    checkpoint: str,
    *,
    bins: int | None = None,
    b: int = 16,
    B: int = 64,
    reps: int = DEFAULT_REPS,
    ema: bool = False,
    seed: int = 0,
) -> dict:
    """Per-bin and global GNS of ``checkpoint``; returns the ``--json`` document (see module docstring).

    Steps: 1. validate; 2. load weights and data; 3. per bin (then globally) ``reps`` independent draws of ``B``
    examples, each -> ``(|G_b|^2, |G_B|^2)`` -> unbiased ``|G|^2``, ``tr(Sigma)``; 4. means, SEs, B_simple.
    ``per_example_gradients`` counts each example once per gradient it enters: ``B`` per repetition.
    """
    t0 = time.perf_counter()
    step, draws = probe_draws(checkpoint, bins=bins, b=b, B=B, reps=reps, ema=ema, seed=seed)
    rows = [probe_row(*d) for d in draws]
    seconds = time.perf_counter() - t0
    return {
        "checkpoint": str(checkpoint),
        "step": step,
        "bins": [row.to_json() for row in rows[:-1]],
        "global": rows[-1].to_json(),
        "per_example_gradients": len(draws) * reps * B,
        "seconds": seconds,
    }


def _pm(x: float, se: float) -> str:
    return f"{x:11.4g} ± {se:<9.2g}" if math.isfinite(x) else f"{'nan':>11s}   {'':9s}"


def format_table(result: dict, header: str = "") -> str:
    """The printed table: one line per bin, then the global line, then the cost."""
    lines = [header] if header else []
    lines.append(f"{'bin':>4s}  {'timesteps':>9s}  {'|G|^2':>23s}  {'tr(Sigma)':>23s}  {'B_simple':>23s}")
    for row in [*result["bins"], {**result["global"], "bin": "all"}]:
        lo, hi = row["timesteps"]
        lines.append(
            f"{row['bin']!s:>4s}  {lo:>4d}..{hi:<3d}  {_pm(row['g2'], row['g2_se'])}  "
            f"{_pm(row['trace'], row['trace_se'])}  {_pm(row['b_simple'], row['b_simple_se'])}"
        )
    lines.append(f"per-example gradients {result['per_example_gradients']}   seconds {result['seconds']:.1f}")
    return "\n".join(lines)
