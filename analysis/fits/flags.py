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
COARSE_LR_GRID = "coarse_lr_grid"

# a fitted point is coarse when its crossing comes after fewer than this many evaluation intervals: linear
# interpolation between evaluations (and integer optimizer steps) then moves the steps by up to 1/10
COARSE_MIN_INTERVALS = 10
# near the floor: the best trial's loss, around its crossing, fluctuates so much relative to its descent that
# the band ±NEAR_FLOOR_Z·scatter maps to more than NEAR_FLOOR_FRAC of the crossing step (or does not descend)
NEAR_FLOOR_Z = 2.0
NEAR_FLOOR_FRAC = 0.12
# coarse lr grid: B_crit through each batch size's interpolated lr optimum (analysis.fits.lr_grid) lies beyond this
# share of the interval's distance from B_crit on its side. A bias of f half-widths leaves a 90% interval
# Phi(1.645 (1 - f)) + Phi(1.645 (1 + f)) - 1 coverage (0.79 at 0.5, 0.66 at 0.75); lower thresholds would catch
# smaller biases but the interpolated optimum is itself noisy: on 30 sweeps of each synth_shapes shape (seeds
# 700-729, nominal interval) 0.5 took 15-29% of the trusted targets of the four shapes the interval already held, 0.75
# 5-12% (and 80% of quiet3's, 91% of its misses) -- benchmarks/RESULTS.md, 2026-11-27
COARSE_LR_FRAC = 0.75

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
        "the interpolation between evaluations (and integer steps) is not negligible",
        "evaluate more often (`eval_every`) or use a lower target",
    ),
    NEAR_FLOOR: (
        "the best trial of some batch size crosses the target by fluctuation near its noise floor: its loss "
        f"scatter around the crossing (x{NEAR_FLOOR_Z:g}) spans more than {NEAR_FLOOR_FRAC:.0%} of the crossing step; "
        "single runs then cross early and B_crit is biased",
        "use a higher target, or reduce the eval noise floor (smaller lr / learning-rate decay, more seeds)",
    ),
    LR_AT_EDGE: (
        "the best learning rate at some fitted batch size is the smallest or largest one tried there (diverged "
        "trials count as tried): the optimum may lie outside the searched range",
        "widen the learning-rate range on that side for those batch sizes",
    ),
    COARSE_LR_GRID: (
        "the learning-rate grid is too coarse around the best lr: B_crit refitted through each batch size's optimum "
        "interpolated between its grid points (`b_crit_lr_opt`: a parabola in steps vs log lr with the curvature "
        "the batch sizes share, its vertex kept between the tried neighbours) moves by more than "
        f"{COARSE_LR_FRAC:g} of the interval's distance on that side, or some batch size's optimum lies beyond a "
        "tried neighbour that gave no point (diverged, failed, stopped short); the grid's own error is then of "
        "the size of the interval, which does not hold it "
        f"(a bias of {COARSE_LR_FRAC:g} half-widths leaves a 90% interval about 2/3 coverage)",
        "add learning rates at half the spacing around the best one (and just below a diverged neighbour) at the "
        "batch sizes whose `steps_refined` differs most from `steps`",
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
