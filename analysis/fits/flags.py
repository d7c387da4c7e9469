"""Why a B_crit may not be trustworthy: the flags every target entry of ``bcrit.json`` carries, defined once.

A target entry's ``"flags"`` is a list of the names below; an empty list means the analysis found nothing that
makes the number untrustworthy, and only such targets enter the headline (the summary line of ``bcrit analyze``,
the first table of ``report.md``). The flag table of docs/analysis.md is generated from :data:`FLAG_DOCS`
(``python -m analysis.fits.flags``). The thresholds the rules use are named here too.
"""

from __future__ import annotations

EXTRAPOLATED = "extrapolated"
CENSORED_BATCH_SIZES = "censored_batch_sizes"
COARSE_STEPS = "coarse_steps"
NEAR_FLOOR = "near_floor"
LR_AT_EDGE = "lr_at_edge"
LR_AT_DIVERGENCE = "lr_at_divergence"

# a fitted point is coarse when its crossing comes after fewer than this many evaluation intervals: the crossing then
# rests on few evaluations. From 10 intervals on, the local fit (analysis.fits.crossing) places a power law's
# crossing within a fraction of a percent of the exact one; below that its error grows quickly
# (tests/analysis/test_crossing.py)
COARSE_MIN_INTERVALS = 10
# near the floor: the best trial's loss, around its crossing, fluctuates so much relative to its descent that
# the band ±NEAR_FLOOR_Z·scatter maps to more than NEAR_FLOOR_FRAC of the crossing step (or does not descend)
NEAR_FLOOR_Z = 2.0
NEAR_FLOOR_FRAC = 0.12
# at the divergence edge: the steps a fitted point would gain at its learning-rate optimum, interpolated between its
# best lr and a neighbour that diverged (analysis.fits.lr_grid), exceed LR_DIVERGENCE_GAP (in log steps: 1%) and
# LR_DIVERGENCE_FRAC of the B_crit interval's half-width (in log B: a point's gap moves B_crit about as much or
# more, so such a gap shifts the answer by a good part of its interval: docs/design.md)
LR_DIVERGENCE_GAP = 0.01
LR_DIVERGENCE_FRAC = 0.25

# what the bootstrap interval resamples (the target entry's "ci_resamples"; a statement, not a flag)
CI_SEEDS = "seeds"  # seeds within each (batch size, nuisance setting), the best setting re-taken
CI_TRIALS = "trials"  # trials (one seed per setting) within each batch size: seed-to-seed noise is not in it

FLAG_DOCS: dict[str, tuple[str, str]] = {
    EXTRAPOLATED: (
        "B_crit lies outside [smallest, largest] batch size of the fitted points: the fit extrapolates",
        "add batch sizes on that side of B_crit",
    ),
    CENSORED_BATCH_SIZES: (
        "at some batch size a setting stopped (global target, budget, still running) before the best known "
        "steps without reaching this target, so that batch size's minimum is unknown; it is left out of the "
        "fit and listed in `censored_batch_sizes` with the reason",
        "lower the sweep's `stopping.target_loss` below this target or raise `max_steps`",
    ),
    COARSE_STEPS: (
        f"a fitted point reaches the target within fewer than {COARSE_MIN_INTERVALS} evaluation intervals, so "
        "its crossing rests on few evaluations (on a power-law curve the crossing fit errs by up to 0.7% at 6 "
        "intervals and 6% at 3, against 0.2% from 10 on)",
        "evaluate more often (`eval_every`) or use a lower target",
    ),
    NEAR_FLOOR: (
        "the best trial of some batch size crosses the target by fluctuation near its noise floor: its loss "
        f"scatter around the crossing (x{NEAR_FLOOR_Z:g}) spans more than {NEAR_FLOOR_FRAC:.0%} of the crossing step; "
        "a crossing there rests on a fit through scatter as large as the descent, and B_crit is unreliable",
        "use a higher target, or reduce the eval noise floor (smaller lr / learning-rate decay, more seeds)",
    ),
    LR_AT_EDGE: (
        "the best learning rate at some fitted batch size is the smallest or largest one tried there (diverged "
        "trials count as tried): the optimum may lie outside the searched range",
        "widen the learning-rate range on that side for those batch sizes",
    ),
    LR_AT_DIVERGENCE: (
        "at some fitted batch size the best learning rate's neighbour diverged, and the steps still fall towards it: "
        "the optimum lies between the two, where the grid measured nothing (interpolated with the curvature the "
        f"other batch sizes share, the point would be faster there by more than {LR_DIVERGENCE_GAP:.0%} and "
        f"{LR_DIVERGENCE_FRAC:g} of the interval's half-width, in log); B_crit is then biased, low where the "
        "optimum moves up with B",
        "add learning rates between the best and the diverged one (a finer grid near divergence) at those batch sizes",
    ),
}
FLAGS = tuple(FLAG_DOCS)


def markdown_table() -> str:
    """The flag table of docs/analysis.md."""
    lines = ["| flag | meaning | what to change in the sweep |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | {what} | {fix} |" for name, (what, fix) in FLAG_DOCS.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
