"""``bcrit sweep --resume`` of an adaptive sweep with a new goal or budget: ``--set nuisance.goal.rel_ci=0.1`` (or
``nuisance.budget.*``) on its directory, or its YAML edited only there. Every other change is refused as for any
sweep (orchestrator.specs.resume_rules.spec_to_run). The restored sweep continues from the trials already run: the new
goal and budget replace the searcher's (orchestrator.features.adaptive.adaptive_search restores its trials, not its
goal), the
saved spec is rewritten (orchestrator.execution.tuner.restore_tuner), and Tune's search-generator state, which
remembers that the old search finished, is re-opened so the searcher -- the one that knows whether the new goal is met
-- decides again."""

from __future__ import annotations

import copy
import glob
import os

from orchestrator.errors import UserError
from orchestrator.specs.sweep_spec import SweepSpec
from orchestrator.storage.layout import SPEC_FILE
from orchestrator.storage.uri import is_uri

ADJUSTABLE = ("nuisance.goal", "nuisance.budget")
GEN_STATE = "search_gen_state-*.json"  # Tune's SearchGenerator state in the experiment dir (Tune's own pickle)


def _only_goal(sets: list[str]) -> bool:
    """Whether every ``--set KEY=VALUE`` changes the goal or the budget."""
    keys = [s.split("=", 1)[0].strip() for s in sets]
    return bool(keys) and all(any(k == a or k.startswith(a + ".") for a in ADJUSTABLE) for k in keys)


def _without_goal(spec: SweepSpec) -> dict:
    raw = copy.deepcopy(spec.raw)
    for k in ("goal", "budget"):
        raw.get("nuisance", {}).pop(k, None)
    return raw


def resume_spec(args, load_spec, restore_spec) -> SweepSpec | None:
    """The spec of ``--resume`` when it changes an adaptive sweep's goal or budget only; None otherwise (the usual
    rules then apply)."""
    if not args.resume:
        return None
    if os.path.isdir(args.spec):
        if not _only_goal(args.set):
            return None
        saved = restore_spec(args.spec)
        if saved.search != "adaptive":
            return None
        return load_spec(os.path.join(saved.sweep_dir, SPEC_FILE), args.set, sweep_dir=saved.sweep_dir)
    new = load_spec(args.spec, args.set)
    if new.search != "adaptive" or not os.path.exists(os.path.join(new.sweep_dir, SPEC_FILE)):
        return None
    saved = restore_spec(new.sweep_dir)
    if saved.search != "adaptive" or _without_goal(saved) != _without_goal(new):
        return None
    return new


def renew(searcher, spec: SweepSpec, experiment_dir: str) -> None:
    """On a restored adaptive sweep: the restored ``searcher`` takes the spec's goal and budget, and Tune's search
    generator is re-opened (the Tuner that restores updates its own callbacks and saves the spec)."""
    # Ray: deferred, importing adaptive_resume loads no Ray
    from ray.tune.utils.util import _atomic_save, _load_newest_checkpoint

    from orchestrator.features.adaptive.adaptive_search import AdaptiveSearch

    if isinstance(searcher, AdaptiveSearch):
        fresh = AdaptiveSearch.from_spec(spec)

        def key(a: AdaptiveSearch) -> list:
            return [a.goal.rel_ci, list(a.goal.targets), a.goal.min_seeds, a.goal.bins, a.budget.examples,
                    a.budget.trials, getattr(a, "_end_running", False)]  # fmt: skip

        if is_uri(experiment_dir) and key(searcher) != key(fresh):
            # Tune's generator state lives at the URI; re-opening it there is not built
            hint = ""
            if key(searcher)[:-1] == key(fresh)[:-1]:  # only goal.running differs
                was = "end" if getattr(searcher, "_end_running", False) else "wait"
                hint = f" (it ran with nuisance.goal.running: {was}: resume with --set nuisance.goal.running={was})"
            raise UserError(
                f"{spec.storage_uri}: a new goal or budget on --resume is not supported for URI storage yet; "
                f"resume with the sweep's own goal and budget (or run it with a directory storage){hint}"
            )
        searcher.goal, searcher.budget = fresh.goal, fresh.budget
        # goal.running, goal.hold, and this driver's signal (a searcher pickled before these existed has none)
        searcher._end_running, searcher._signal_synced = fresh._end_running, fresh._signal_synced
        searcher._hold = fresh._hold
    files = sorted(glob.glob(os.path.join(experiment_dir, GEN_STATE)))
    state = _load_newest_checkpoint(experiment_dir, GEN_STATE)
    if files and state and state.get("finished"):
        state["finished"] = False  # the searcher says FINISHED again at once if its goal is still met
        name = os.path.basename(max(files))
        _atomic_save(state, experiment_dir, name, f"tmp-{name}")
