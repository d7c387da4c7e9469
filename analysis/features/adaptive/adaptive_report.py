"""The adaptive sweep's design in ``bcrit analyze``'s report: which trials the design chose and why, how the B_crit
interval narrowed, and why the sweep stopped -- read from the decisions file that the sweep's searcher writes into
the sweep directory (orchestrator.features.adaptive.adaptive_search; docs/sweeps.md "Adaptive search")."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from analysis.sources.schema import DECISIONS_FILE  # written by orchestrator.features.adaptive.adaptive_search

KINDS = {
    "design": "the initial design spanning the batch sizes",
    "bracket": "a batch size with no fitted point yet: the next learning rate past its best tried one",
    "lr_edge": "the best learning rate sat at the edge of those tried: the next one beyond it",
    "lr_refine": "an untried learning rate between a batch size's best and a tried neighbour",
    "seed": "another seed of a batch size's best setting (or a close neighbour's, by its chance to be best)",
    "batch_size": "an untried batch size where the fit was least determined",
    "": "running when the driver was restarted; adopted from Tune's restored trials",
}
STOPS = {
    "goal_met": "the goal was met",
    "budget_trials": "the trial budget was spent",
    "budget_examples": "the examples budget was spent",
    "space_exhausted": "nothing was left to try",
    None: "it did not stop on its own (interrupted, or still running)",
}


def load_decisions(source: str | Path) -> dict | None:
    """The decisions of the sweep directory ``source`` (None: not a directory of an adaptive sweep)."""
    path = Path(str(source)) / DECISIONS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _pct(w: float | None) -> str:
    return "no fit" if w is None else f"±{w:.0%}"


def _bins_goal(goal: dict) -> str:
    return ", and so every timestep bin's the analysis trusts (`goal.bins`)" if goal.get("bins") else ""


def _bins_lines(refit: dict) -> list[str]:
    """The last refit's per-bin intervals: the widest counted one, and each bin the goal did not count, and why."""
    bins = refit.get("bins", [])
    if not bins:
        return ["At the last refit no trial had reported a per-bin eval loss: the per-bin goal could not be checked."]
    w = refit["widest"]
    out = [f"At the last refit the widest interval the goal counted was {w['what']} ({_pct(w['width'])})."]
    bad = [b for b in bins if not b["counted"]]
    if bad:
        out.append(
            f"Not counted (untrusted by the analysis, {len(bad)} of {len(bins)} bin intervals): "
            + "; ".join(
                f"t={b['timesteps'][0]}-{b['timesteps'][1]} at {b['target']:g} "
                f"({', '.join(b['flags']) or 'no interval'})"
                for b in bad
            )  # fmt: skip
            + "."
        )
    return out


def markdown_lines(d: dict) -> list[str]:
    """The report's section on the adaptive design."""
    goal, budget = d["goal"], d["budget"]
    spend = " and ".join(f"{v:g} {k}" for k, v in budget.items() if v is not None)
    fitted = [r for r in d["refits"] if r["widths"] and all(w is not None for w in r["widths"].values())]
    lines = [
        "",
        "## Adaptive design (`nuisance.search: adaptive`)",
        "",
        f"Goal: the {', '.join(f'{t:g}' for t in goal['targets'])} target(s)' 90% B_crit interval within "
        f"±{goal['rel_ci']:.0%} of B_crit{_bins_goal(goal)}, with {goal['min_seeds']} seeds at every batch size's "
        f"best setting; budget {spend}. It stopped because {STOPS.get(d['stop'], d['stop'])}, after "
        f"{len(d['issued'])} trials and {len(d['refits'])} refits.",
    ]
    ending = [t for r in d["refits"] for t in r.get("ending") or []]
    if ending:
        lines.append(
            f"{len(ending)} trial(s) still running at the stop were asked to end (status `ended_at_goal` unless it "
            f"finished first: its rows are kept and its examples counted, but the answer is the finished trials' "
            f"the goal was met on): " + ", ".join(f"`{t}`" for t in ending) + "."
        )
    if fitted:
        a, b = fitted[0], fitted[-1]
        lines.append(
            f"Relative half-width at the targets: {', '.join(f'{t}: {_pct(w)}' for t, w in a['widths'].items())} "
            f"after {a['trials_finished']} trials, {', '.join(f'{t}: {_pct(w)}' for t, w in b['widths'].items())} "
            f"after {b['trials_finished']} (the decisions' own refits, {len(fitted)} with a fit)."
        )
    if goal.get("bins") and d["refits"]:
        lines += _bins_lines(d["refits"][-1])
    counts = Counter(t["kind"] for t in d["issued"])
    lines += ["", "Why each trial was chosen:", ""]
    lines += [f"- `{k or 'adopted'}` ({n}): {KINDS.get(k, k)}" for k, n in counts.most_common()]
    lines += ["", "| # | trial | B | lr | seed | kind | reason |", "|---:|:---|---:|---:|---:|:---|:---|"]
    for i, t in enumerate(d["issued"], 1):
        lines.append(
            f"| {i} | `{t['trial_id']}` | {t['batch_size']} | {t['lr']:g} | {t['seed']} | {t['kind'] or 'adopted'} "
            f"| {t['reason'] or '–'} |"
        )
    lost = d.get("lost", [])
    if lost:
        named = ", ".join(f"`{t['trial_id']}` (B={t['batch_size']}, lr={t['lr']:g}, seed {t['seed']})" for t in lost)
        lines += ["", f"Lost with a killed driver (handed out after Tune's last save, running at the kill): {named}."]
        lines.append("Each lost setting was handed out again; the trials above are the ones that ran.")
    return lines
