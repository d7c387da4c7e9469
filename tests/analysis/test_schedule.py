"""The schedule proposal (analysis.features.schedule.schedule): segments from an analysis, the step-minimising plans
against brute
force, and the known answer on the noisy quadratic model (closed forms of tests.oracles.nqm and
tests.oracles.nqm_schedule)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from analysis.features.schedule.schedule import Segment, pareto_front, plan, propose, segments_of
from tests.oracles.nqm import closed_form_b_crit
from tests.oracles.nqm_schedule import expected_to_target_staged


def measured_to_target(step, examples, value, target: float) -> tuple[float, float]:
    """``(steps, examples)`` at one trial's first crossing of ``value <= target`` (its evaluation rows, in step
    order), each interpolated linearly between the two evaluations like :func:`analysis.fits.steps.steps_to_target`;
    the examples come from the rows' own ``examples`` column (the true count under a schedule). ``(inf, inf)``
    if never reached."""
    step, examples, value = (np.asarray(x, dtype=np.float64) for x in (step, examples, value))
    below = np.flatnonzero(value <= target)
    if not len(below):
        return float("inf"), float("inf")
    i = int(below[0])
    if i == 0:
        return float(step[0]), float(examples[0])
    frac = (value[i - 1] - target) / (value[i - 1] - value[i])
    return float(step[i - 1] + frac * (step[i] - step[i - 1])), float(
        examples[i - 1] + frac * (examples[i] - examples[i - 1])
    )


def result_from(s_min, e_min, targets=(1.0, 0.5, 0.25, 0.125), bands=()) -> dict:
    """A bcrit.json metric result with cumulative S_min/E_min per target (highest loss first)."""
    ts = [{"target": y, "s_min": s, "e_min": e} for y, s, e in zip(targets, s_min, e_min, strict=True)]
    return {"targets": ts[::-1], "bands": list(bands)}  # any order: segments_of sorts


def test_segments_are_the_differences_of_the_targets_fits_or_the_bands_own():
    r = result_from([2.0, 5.0, 9.0, 14.0], [20.0, 80.0, 400.0, 2000.0])
    segs, notes = segments_of(r)
    assert [(s.s_min, s.e_min, s.source) for s in segs] == [
        (2.0, 20.0, "target"), (3.0, 60.0, "difference"), (4.0, 320.0, "difference"), (5.0, 1600.0, "difference"),
    ]  # fmt: skip
    assert [s.b_local for s in segs] == [10.0, 20.0, 80.0, 320.0] and notes == []
    band = {"hi": 0.5, "lo": 0.25, "s_min": 3.5, "e_min": 300.0}
    segs, _ = segments_of(result_from([2.0, 5.0, 9.0, 14.0], [20.0, 80.0, 400.0, 2000.0], bands=[band]))
    assert (segs[2].s_min, segs[2].e_min, segs[2].source) == (3.5, 300.0, "band")


def test_a_noisy_segment_is_merged_with_the_one_before():
    segs, notes = segments_of(result_from([2.0, 5.0, 4.8, 14.0], [20.0, 80.0, 400.0, 2000.0]))
    assert [(s.hi, s.lo, s.source) for s in segs] == [
        (None, 1.0, "target"),
        (1.0, 0.25, "merged"),
        (0.25, 0.125, "difference"),
    ]
    assert segs[1].s_min == pytest.approx(2.8) and segs[1].e_min == pytest.approx(380.0)
    assert len(notes) == 1 and "merged" in notes[0]


SEGS = [Segment(None, 1.0, 3.0, 30.0, "target"), Segment(1.0, 0.5, 4.0, 400.0, "difference"),
        Segment(0.5, 0.2, 2.0, 2000.0, "difference")]  # fmt: skip
CAND = [8, 16, 32, 64, 128, 256, 512, 1024]


def test_pareto_front_is_exact_against_every_plan():
    every = [plan(SEGS, sizes) for sizes in itertools.product(CAND, repeat=len(SEGS)) if sorted(sizes) == list(sizes)]
    front = pareto_front(SEGS, CAND)  # against the 120 non-decreasing plans of 3 segments x 8 sizes, float64
    assert len(front) >= 5
    for p in front:  # no plan has fewer steps for at most its examples
        best = min(q.total_steps for q in every if q.total_examples <= p.total_examples * (1 + 1e-12))
        assert p.total_steps == pytest.approx(best, rel=1e-12)
    for q in every:  # and every plan is matched or beaten by one on the front
        assert any(p.total_examples <= q.total_examples + 1e-9 and p.total_steps <= q.total_steps + 1e-9 for p in front)
    assert all(list(p.sizes) == sorted(p.sizes) for p in front)
    for ref in CAND:  # the proposal within each constant's examples is the brute-force optimum
        budget = plan(SEGS, [ref] * 3).total_examples
        best = min(q.total_steps for q in every if q.total_examples <= budget * (1 + 1e-12))
        assert propose(SEGS, CAND, ref).schedule.total_steps == pytest.approx(best, rel=1e-12)


def test_proposal_beats_the_reference_constant_within_its_examples():
    p = propose(SEGS, CAND)
    b_crit = sum(s.e_min for s in SEGS) / sum(s.s_min for s in SEGS)  # 270
    assert p.reference.sizes == (256,) * 3 and abs(np.log(256 / b_crit)) < np.log(2) / 2
    assert p.schedule.total_examples <= p.reference.total_examples
    assert p.schedule.total_steps < p.reference.total_steps
    assert p.schedule.sizes[0] < p.schedule.sizes[-1]  # small early, large late
    stages, lrs = p.schedule.stages([{b: 0.1 * b for b in CAND}] * 3)
    assert stages.sizes == tuple(dict.fromkeys(p.schedule.sizes))  # consecutive equal batch sizes merged
    assert lrs == [0.1 * b for b in stages.sizes]
    assert stages.starts[1] == round(p.schedule.steps[0])


def test_measured_crossing_interpolates_steps_and_the_examples_column():
    steps, ex, loss = [0, 1, 2, 3], [0, 8, 16, 32], [4.0, 3.0, 2.0, 1.0]
    assert measured_to_target(steps, ex, loss, 1.5) == (2.5, 24.0)
    assert measured_to_target(steps, ex, loss, 5.0) == (0.0, 0.0)
    assert measured_to_target(steps, ex, loss, 0.5) == (np.inf, np.inf)


def test_nqm_known_answer_predicted_vs_closed_form():
    """On the NQM, S(B; y) per target from the closed form (lr tuned per batch size), the proposal, then the exact
    expected loss of the proposed schedule run with each stage's tuned lr: the schedule really saves steps (and
    examples) against the reference constant, and the prediction is within 15% of the exact steps (the segment
    model's error: the NQM's state at a loss depends on the path; measured 11%)."""
    h = np.arange(1, 101, dtype=np.float64) ** -1.0
    c, m0 = h.copy(), np.ones(100)
    bs, lrs = [16, 32, 64, 128, 256, 512, 1024], np.geomspace(0.01, 1.99, 80)
    targets = []
    for y in 0.5 * h.sum() * np.array([0.3, 0.1, 0.03, 0.01]):
        q = closed_form_b_crit(h, c, m0, y, bs, lrs=lrs)
        points = [{"batch_size": int(b), "lr": float(lr)} for b, lr in zip(q.batch_sizes, q.best_lr, strict=True)]
        targets.append({"target": float(y), "s_min": q.s_min, "e_min": q.e_min, "points": points})
    segs, _ = segments_of({"targets": targets, "bands": []})
    p = propose(segs, bs)
    lr_at = {t["target"]: {pt["batch_size"]: pt["lr"] for pt in t["points"]} for t in targets}
    seg_lrs = [lr_at[s.lo] for s in segs]

    def exact(pl):
        stages, stage_lrs = pl.stages(seg_lrs)
        return expected_to_target_staged(h, c, m0, stages, stage_lrs, segs[-1].lo, 20_000)

    (s_sched, e_sched), (s_ref, e_ref) = exact(p.schedule), exact(p.reference)
    assert len(set(p.schedule.sizes)) >= 2
    assert s_sched < 0.95 * s_ref and e_sched <= e_ref  # measured: 12% fewer steps, 17% fewer examples
    assert abs(p.schedule.total_steps / s_sched - 1) < 0.15
    for const in p.constants:  # the constant batch sizes: only the fit S = S_min + E_min/B stands between them
        assert abs(const.total_steps / exact(const)[0] - 1) < 0.1
