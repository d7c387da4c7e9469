"""A batch-size schedule from a sweep's analysis (analysis.features.schedule.schedule), shared by ``bcrit schedule`` and
the schedule line of ``bcrit recommend``: the analysis file, the batch sizes, the tuned lrs, the measured throughput and
the proposal's summary."""

from __future__ import annotations

import math
import os

from analysis.core import metrics as M
from orchestrator.errors import UserError


def analysis_file(path: str) -> tuple[str, str | None]:
    """``(bcrit.json, sweep dir or None)`` of the positional argument."""
    if os.path.isfile(path):
        return path, None
    candidate = os.path.join(path, "analysis", "bcrit.json")
    if os.path.isfile(candidate):
        return candidate, path
    raise UserError(f"{path} holds no analysis ({candidate} missing); run `bcrit analyze {path}` first")


def batch_sizes_of(text: str | None, result: dict) -> list[int]:
    if text is None:
        found = {int(p["batch_size"]) for t in result["targets"] for p in t.get("points", [])}
        if not found:
            raise UserError("the analysis lists no batch sizes; give --batch-sizes 16,32,...")
        return sorted(found)
    try:
        sizes = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise UserError(f"--batch-sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise UserError(f"--batch-sizes must be positive integers, got {text!r}")
    return sizes


def throughput_per_batch(sweep: str | None, runs=None) -> dict[int, float]:
    """Median ``sys/examples_per_s`` per batch size of the sweep's trials (``runs`` when given, else read from the
    sweep directory; {} without tables or measurements)."""
    # numpy: deferred, bcrit --help loads this module
    import numpy as np

    # numpy and pyarrow: deferred, bcrit --help loads this module
    from analysis.sources.loaders import load_sweep_dir

    if runs is None:
        if sweep is None or not os.path.isfile(os.path.join(sweep, "metrics.parquet")):
            return {}
        runs = load_sweep_dir(sweep)
    s = runs.series(M.SYS_EXAMPLES_PER_S)
    b = runs.batch_size[s.trial]
    return {int(x): float(np.median(s.value[b == x])) for x in np.unique(b)}


def is_fitted(t: dict) -> bool:
    return all(isinstance(t.get(k), (int, float)) and math.isfinite(t[k]) for k in ("s_min", "e_min"))


def tuned_lrs(result: dict, segments) -> list[dict[int, float]]:
    """Per segment, batch size -> the best trial's lr at the segment's end target; a batch size that did not reach
    that target keeps its lr of the last target it reached."""
    known: dict[int, float] = {}
    at: dict[float, dict[int, float]] = {}
    for t in sorted(result["targets"], key=lambda t: -t["target"]):
        known = {**known, **{int(p["batch_size"]): p["lr"] for p in t.get("points", []) if p.get("lr") is not None}}
        at[t["target"]] = known
    return [at.get(s.lo, {}) for s in segments]


def summary(proposal, seg_lrs: list[dict], throughput: dict[int, float], notes: list[str]) -> dict:
    """The proposal as plain data (what schedule.json holds)."""
    stages, stage_lrs = proposal.schedule.stages(seg_lrs)
    entries = [
        [s, b] if lr is None else [s, b, lr] for s, b, lr in zip(stages.starts, stages.sizes, stage_lrs, strict=True)
    ]

    def row(name: str, p) -> dict:
        return {"plan": name, "sizes": list(p.sizes), "steps": p.total_steps, "examples": p.total_examples,
                "seconds": p.seconds(throughput)}  # fmt: skip

    return {
        "segments": [
            {
                "hi": s.hi,
                "lo": s.lo,
                "s_min": s.s_min,
                "e_min": s.e_min,
                "b_local": s.b_local,
                "source": s.source,
                "batch_size": b,
                "steps": st,
            }
            for s, b, st in zip(proposal.segments, proposal.schedule.sizes, proposal.schedule.steps, strict=True)
        ],  # fmt: skip
        "trial": {"batch_size": stages.sizes[0], "lr": stage_lrs[0], "batch_schedule": entries[1:]},
        "schedule": row("schedule", proposal.schedule),
        "reference": row(f"constant {proposal.reference.sizes[0]}", proposal.reference),
        "constants": [row(f"constant {p.sizes[0]}", p) for p in proposal.constants],
        "notes": notes,
    }


def fmt_num(x: float | None, fmt: str = ".4g") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)
