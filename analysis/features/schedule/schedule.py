"""Propose a batch-size schedule from the critical batch size measured along training.

From a sweep's analysis (``bcrit.json``): the fit ``S(B; y) = S_min(y) + E_min(y)/B`` per target and the band fits
``ΔS(B) = ΔS_min + ΔE_min/B`` between consecutive targets (analysis.fits.band). Training is cut into segments
(initialisation -> first target, then each band), each assumed to take steps that depend only on the batch size used
in it, so a schedule ``B_j`` per segment takes ``Σ_j ΔS_min,j + ΔE_min,j / B_j`` steps and ``Σ_j B_j ΔS_min,j +
ΔE_min,j`` examples. The proposal is the plan with the fewest steps among those whose batch size never decreases
(:func:`pareto_front`) and that use at most the examples of a **reference constant batch size** (default: the
allowed one nearest the last target's B_crit); it reports the steps and examples saved against it and against every
constant batch size, with time from ``sys/examples_per_s`` where the sweep measured it. Why non-decreasing, and how
the batch follows the local critical batch size: docs/design.md.

Pure numpy; printed by ``bcrit schedule`` (orchestrator/cli/schedule_cmd.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.core.stages import BatchStages


@dataclass(frozen=True)
class Segment:
    """A stretch of training between two losses: its extra steps at batch size ``B`` are ``s_min + e_min / B``."""

    hi: float | None  # loss at its start (None: initialisation)
    lo: float  # the target at its end
    s_min: float  # ΔS_min
    e_min: float  # ΔE_min
    source: str  # "target" (the first segment: the target's own fit), "band" or "difference" (of two targets' fits)

    @property
    def b_local(self) -> float:
        return self.e_min / self.s_min

    def steps(self, b: float) -> float:
        return self.s_min + self.e_min / b


def segments_of(result: dict) -> tuple[list[Segment], list[str]]:
    """The segments of one metric's analysis (``bcrit.json``: ``targets`` and ``bands``), highest loss first, and
    notes on targets left out. A band's own fit is used where the analysis has it, else the difference of the two
    targets' fits; a segment whose ΔS_min or ΔE_min is not positive (noise) is merged into the next one."""
    targets = sorted((t for t in result.get("targets", []) if _finite(t.get("s_min"), t.get("e_min"))),
                     key=lambda t: -t["target"])  # fmt: skip
    bands = {(b["hi"], b["lo"]): b for b in result.get("bands", [])}
    out: list[Segment] = []
    notes: list[str] = []
    prev = None
    for t in targets:
        if prev is None:
            seg = Segment(None, t["target"], t["s_min"], t["e_min"], "target")
        elif (prev["target"], t["target"]) in bands:
            b = bands[(prev["target"], t["target"])]
            seg = Segment(prev["target"], t["target"], b["s_min"], b["e_min"], "band")
        else:
            ds, de = t["s_min"] - prev["s_min"], t["e_min"] - prev["e_min"]
            seg = Segment(prev["target"], t["target"], ds, de, "difference")
        if not (seg.s_min > 0 and seg.e_min > 0) and out:  # noise: one segment from the previous one's start
            last = out.pop()
            merged = Segment(last.hi, seg.lo, last.s_min + seg.s_min, last.e_min + seg.e_min, "merged")
            notes.append(f"segment {seg.hi:.4g} -> {seg.lo:.4g} has ΔS_min {seg.s_min:.3g}, ΔE_min {seg.e_min:.3g} "
                         f"(not both > 0): merged with {last.hi} -> {last.lo:.4g}")  # fmt: skip
            seg = merged
        if not (seg.s_min > 0 and seg.e_min > 0):
            notes.append(f"target {t['target']:.4g}: S_min {t['s_min']:.3g} / E_min {t['e_min']:.3g} not both > 0; "
                         "left out")  # fmt: skip
            continue
        out.append(seg)
        prev = t
    return out, notes


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


@dataclass(frozen=True)
class Plan:
    """A batch size per segment and its predicted steps per segment."""

    sizes: tuple[int, ...]
    steps: tuple[float, ...]

    @property
    def total_steps(self) -> float:
        return float(sum(self.steps))

    @property
    def total_examples(self) -> float:
        return float(sum(b * s for b, s in zip(self.sizes, self.steps, strict=True)))

    def seconds(self, throughput: dict[int, float]) -> float | None:
        """Predicted training seconds from examples per second per batch size (None if one is not measured)."""
        if any(b not in throughput for b in self.sizes):
            return None
        return float(sum(b * s / throughput[b] for b, s in zip(self.sizes, self.steps, strict=True)))

    def stages(self, lrs: list[dict[int, float]] | None = None) -> tuple[BatchStages, list[float | None]]:
        """The plan as a trial's stages -- consecutive segments at one batch size merged, each switch at the
        predicted (rounded) step where its segment starts -- and each stage's learning rate: from ``lrs`` (per
        segment, batch size -> the tuned lr at the segment's end target), the lr of the stage's last segment."""
        starts, sizes, stage_lrs = [0], [self.sizes[0]], []
        done = 0.0
        for j, (b, s) in enumerate(zip(self.sizes, self.steps, strict=True)):
            if b != sizes[-1]:
                starts.append(max(starts[-1] + 1, round(done)))
                sizes.append(b)
            lr = None if lrs is None else lrs[j].get(b)
            stage_lrs[len(sizes) - 1 :] = [lr]
            done += s
        return BatchStages(tuple(starts), tuple(sizes)), stage_lrs


def plan(segments: list[Segment], sizes) -> Plan:
    sizes = tuple(int(b) for b in sizes)
    return Plan(sizes, tuple(seg.steps(b) for seg, b in zip(segments, sizes, strict=True)))


def constant(segments: list[Segment], b: int) -> Plan:
    return plan(segments, [b] * len(segments))


def pareto_front(segments: list[Segment], candidates) -> list[Plan]:
    """Every plan with a batch size that never decreases and that no other such plan beats in both steps and
    examples, fewest examples first. Exact: the front is extended segment by segment, per last batch size, and
    dominated partial plans are dropped (a later segment adds the same steps and examples to every prefix ending at
    the same batch size, so a dominated prefix cannot start a plan on the front)."""
    cand = sorted({int(b) for b in candidates})
    fronts: dict[int, list[tuple[tuple[int, ...], float, float]]] = {0: [((), 0.0, 0.0)]}  # last B -> (sizes, E, S)
    for seg in segments:
        grown: dict[int, list] = {}
        for last, front in fronts.items():
            for b in (b for b in cand if b >= last):
                grown.setdefault(b, []).extend(
                    (sz + (b,), e + b * seg.steps(b), s + seg.steps(b)) for sz, e, s in front
                )
        fronts = {b: _undominated(xs) for b, xs in grown.items()}
    return [plan(segments, sz) for sz, _e, _s in _undominated([x for xs in fronts.values() for x in xs])]


def _undominated(plans: list[tuple[tuple[int, ...], float, float]]) -> list[tuple[tuple[int, ...], float, float]]:
    """The ``(sizes, examples, steps)`` not beaten in both by another, fewest examples first."""
    out, fewest = [], math.inf
    for x in sorted(plans, key=lambda x: (x[1], x[2])):
        if x[2] < fewest:
            out.append(x)
            fewest = x[2]
    return out


@dataclass(frozen=True)
class Proposal:
    segments: list[Segment]
    reference: Plan  # the constant batch size to beat
    schedule: Plan  # the fewest steps with at most the reference's examples
    constants: list[Plan]  # every candidate as a constant batch size


def propose(segments: list[Segment], candidates, reference: int | None = None) -> Proposal:
    """The step-minimising schedule within the examples of the ``reference`` constant batch size (default: the
    candidate nearest, in log, the critical batch size of the whole run, ``Σ ΔE_min / Σ ΔS_min``)."""
    if not segments:
        raise ValueError("no segment with a positive ΔS_min and ΔE_min: the analysis has no usable target")
    cand = sorted(set(int(b) for b in candidates))
    if reference is None:
        b_crit = sum(s.e_min for s in segments) / sum(s.s_min for s in segments)
        reference = min(cand, key=lambda b: abs(math.log(b / b_crit)))
    ref = constant(segments, reference)
    within = [p for p in pareto_front(segments, cand) if p.total_examples <= ref.total_examples * (1 + 1e-12)]
    best = min(within, key=lambda p: (p.total_steps, p.total_examples))  # the reference or a plan dominating it
    return Proposal(segments, ref, best, [constant(segments, b) for b in cand])
