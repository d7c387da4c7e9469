"""Which running trials the fit only needs to know are slower, and may stop now (``stopping.behind``).

The fit uses each batch size's *best* setting (:func:`analysis.fits.steps.best_per_batch`); a trial at another
setting matters only as evidence that it is slower. Once it is behind by more than the seed noise can undo (per
batch size: a *comparator* setting whose every seed reached the target, and a running seed of another setting past
the comparator's largest bootstrap value ``U`` by ``MARGIN`` in log steps at every fitted metric), the rest of its run
buys nothing: it stops with the status ``stopped_behind`` and enters the analysis right-censored at its last
evaluated step, so every bootstrap replicate picks the same best setting as the full run would. Never stopped: the
comparator's seeds, pooled splits, and the learning-rate neighbours of any setting that can still be the best (the
lr-grid checks read them). A batch size no setting reached where a trial was stopped counts as censored at that
target (flag ``censored_batch_sizes``). The rule, its bound and what it cannot promise: docs/design.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from analysis.core import metrics as m
from analysis.sources.schema import NUISANCE_COLUMNS

if TYPE_CHECKING:
    import pyarrow as pa

    from analysis.sources.loaders import Runs

MARGIN = 0.05  # in log steps: how far before a stopped trial's step its fitted crossing may lie
MIN_TRIALS_SETTINGS = 3  # known settings a one-seed batch size needs before any of its trials stops


@dataclass
class Curve:
    """One trial as the rule sees it: its setting, seed, status, and evaluations of the fitted metrics."""

    trial_id: str
    batch_size: int
    setting: tuple  # the nuisance values (lr first) that, with the batch size, make a setting (splits pooled)
    seed: int
    status: str
    steps: list[int] = field(default_factory=list)  # evaluation steps, ascending
    values: dict[str, list[float]] = field(default_factory=dict)  # metric -> values at ``steps`` (nan: none)

    @property
    def lr(self) -> float:
        return float(self.setting[0])

    @property
    def last_step(self) -> int:
        return self.steps[-1] if self.steps else 0

    def add(self, step: int, metric: str, value: float) -> None:
        """Record an evaluation (rows arrive in step order; a metric's value at a step seen before is kept)."""
        if not self.steps or step > self.steps[-1]:
            self.steps.append(step)
            for vals in self.values.values():
                vals.append(math.nan)
        if metric not in self.values:
            self.values[metric] = [math.nan] * len(self.steps)
        if step == self.steps[-1]:
            self.values[metric][-1] = float(value)

    def lowest(self, metric: str) -> float:
        v = np.asarray(self.values.get(metric, []), dtype=np.float64)
        return float(np.nanmin(v)) if np.isfinite(v).any() else math.inf

    def first_at_or_below(self, metric: str, level: float) -> int | None:
        """The first evaluation step at which ``metric`` is at or below ``level`` (None if never)."""
        for s, v in zip(self.steps, self.values.get(metric, []), strict=False):
            if v <= level:
                return s
        return None


@dataclass(frozen=True)
class Seeds:
    """How many seeds each setting will have: ``planned[(batch size, setting)]``, else ``default`` (a grid: its
    configs counted; an adaptive sweep: every seed its space allows, as it may add seeds to the best setting)."""

    planned: dict = field(default_factory=dict)
    default: int = 0

    def of(self, batch_size: int, setting: tuple) -> int:
        return int(self.planned.get((int(batch_size), setting), self.default))

    @classmethod
    def of_configs(cls, configs: list[dict]) -> Seeds:
        """Counted from trial configs (or trials-table rows): distinct seeds per (batch size, setting)."""
        got: dict = {}
        for c in configs:
            got.setdefault((int(c["batch_size"]), setting_of(c)), set()).add(int(c.get("seed", 0) or 0))
        return cls({k: len(v) for k, v in got.items()})


def setting_of(values: dict) -> tuple:
    """A setting's key within its batch size: the nuisance values, lr first, as floats (None where absent); the
    splits of a seed share it (pooled, as the analysis pools them: analysis.fits.steps.pool_splits)."""
    return tuple(None if values.get(c) is None else float(values[c]) for c in NUISANCE_COLUMNS)


def centre_first(configs: list[dict]) -> list[int]:
    """The order a grid sweep launches its trial configs in when it stops trials behind: batch sizes as given, and
    within each, its learning rates from the middle of its grid outwards, every seed of one before the next (the
    likely best first, so that its seeds finish while the far learning rates still run and can be stopped: the
    spec's own order, every lr of one seed before the next seed, leaves the rule nothing to compare with until the
    batch size's last seed). Stable: splits, samplers and other nuisance values keep their order."""
    tried: dict[int, set[float]] = {}  # batch sizes in their order of first appearance
    for c in configs:
        tried.setdefault(int(c["batch_size"]), set()).add(float(c["lr"]))
    grids = {b: sorted(v) for b, v in tried.items()}
    rank = {b: i for i, b in enumerate(grids)}

    def key(i: int) -> tuple:
        b = int(configs[i]["batch_size"])
        k = grids[b].index(float(configs[i]["lr"]))
        return (rank[b], abs(k - (len(grids[b]) - 1) / 2), k)

    return sorted(range(len(configs)), key=key)


def fitted_metric(name: str) -> bool:
    """The metrics whose curves the analysis fits: the global held-out loss and its per-bin restrictions."""
    return name == m.EVAL_LOSS or name.startswith(m.EVAL_LOSS + "/bin")


def _bound(x: np.ndarray) -> float:
    """``U``: the largest log steps a seeds-bootstrap replicate of a setting with these seeds' log steps can take."""
    k = len(x)
    r = math.sqrt(k / (k - 1)) if k > 1 else 1.0
    return float(x.max() + (r - 1.0) * (x.max() - x.min()))


def _per_seed_log_last(trials: list[Curve]) -> np.ndarray:
    """Per seed, the log of its largest last step (a seed with several splits: the slowest, an upper bound)."""
    by_seed: dict[int, int] = {}
    for t in trials:
        by_seed[t.seed] = max(by_seed.get(t.seed, 0), t.last_step)
    return np.log(np.maximum(np.array(list(by_seed.values()), dtype=np.float64), 1.0))


def _pooled(trials: list[Curve]) -> bool:
    seeds = [t.seed for t in trials]
    return len(set(seeds)) < len(seeds)


def _neighbours(settings: dict[tuple, list[Curve]], key: tuple) -> tuple[tuple | None, tuple | None]:
    """The settings just below and above ``key`` in lr among those with the same other nuisance values."""
    same = sorted((k for k in settings if k[1:] == key[1:]), key=lambda k: k[0])
    i = same.index(key)
    return (same[i - 1] if i > 0 else None, same[i + 1] if i + 1 < len(same) else None)


def behind(curves: list[Curve], margin: float = MARGIN, batch_sizes=None, seeds: Seeds | None = None) -> dict[str, str]:
    """``{trial_id: reason}`` of the running trials the fit only needs to know are slower (module docstring);
    ``batch_sizes``: only at these (those whose trials changed), default every one. ``seeds``: how many seeds each
    setting will have in the end (a comparator must have them all: a seed still to come could raise ``U``);
    default: those it has."""
    out: dict[str, str] = {}
    by_b: dict[int, dict[tuple, list[Curve]]] = {}
    for c in curves:
        if batch_sizes is None or c.batch_size in batch_sizes:
            by_b.setdefault(c.batch_size, {}).setdefault(c.setting, []).append(c)
    for b, settings in sorted(by_b.items()):
        out.update(_behind_at(b, settings, margin, seeds))
    return out


def _known(trials: list[Curve], planned: int) -> bool:
    """Every seed of the setting has run and reached the target (``planned``: the seeds it will have)."""
    done = all(t.status == m.STATUS_REACHED_TARGET for t in trials)
    return bool(trials) and done and len({t.seed for t in trials}) >= planned


def _comparator(settings: dict[tuple, list[Curve]], b: int, seeds: Seeds | None) -> tuple[tuple, float] | None:
    """``(C, U)``: the known setting whose replicates' largest value is least, and that value (module docstring)."""
    planned = {k: seeds.of(b, k) if seeds is not None else 0 for k in settings}
    known = {k: _per_seed_log_last(v) for k, v in settings.items() if _known(v, planned[k])}
    if not known:
        return None
    if max(len(x) for x in known.values()) >= 2:  # seeds are resampled
        key = min(known, key=lambda k: _bound(known[k]))
        return key, _bound(known[key])
    if len(known) < MIN_TRIALS_SETTINGS:  # one seed each: settings are resampled, a replicate may miss C
        return None
    key = min(known, key=lambda k: known[k].max())
    return key, max(float(x.max()) for x in known.values())


def _lower_bound(trials: list[Curve]) -> float:
    """The setting's mean log (last) step over its seeds: below ``U`` it can still be the best."""
    return float(np.mean(_per_seed_log_last(trials)))


def _trial_behind(j: Curve, mates: list[Curve], levels: dict[str, float], u: float, margin: float) -> bool:
    """Whether running trial ``j`` (its setting's other seeds ``mates``) is behind ``U`` at every fitted metric."""
    if j.last_step <= 0 or math.log(j.last_step) - margin < u:
        return False
    for metric, level in levels.items():
        own = j.lowest(metric)
        if not own > level:  # it reached the comparator's level (or has no value): it may lead below it
            return False
        for t in mates:  # a replicate of only this seed must not beat U either: past U at j's level
            if not t.lowest(metric) > level:  # a seed of the setting leads there: the setting runs on
                return False
            s = t.first_at_or_below(metric, own)
            if math.log(max(s if s is not None else t.last_step, 1)) < u:
                return False
    return True


def _behind_at(b: int, settings: dict[tuple, list[Curve]], margin: float, seeds: Seeds | None) -> dict[str, str]:
    comp = _comparator(settings, b, seeds)
    if comp is None:
        return {}
    c_key, u = comp
    c_trials = settings[c_key]
    metrics = sorted({name for t in c_trials for name in t.values if fitted_metric(name)})
    if not metrics:
        return {}
    levels = {name: max(t.lowest(name) for t in c_trials) for name in metrics}
    protected: set[tuple] = set()
    for key, trials in settings.items():
        if key == c_key or _lower_bound(trials) < u:  # can still be the best: the lr checks read its neighbours
            protected.update(k for k in _neighbours(settings, key) if k is not None)
    out = {}
    for key, trials in settings.items():
        if key == c_key or key in protected or _pooled(trials):
            continue
        for j in trials:
            if j.status != m.STATUS_RUNNING:
                continue
            mates = [t for t in trials if t is not j]
            if _trial_behind(j, mates, levels, u, margin):
                out[j.trial_id] = (
                    f"behind B={b}'s lr {c_key[0]:g} (steps {math.exp(u):.0f} at most, its {len(c_trials)} "
                    f"seed(s) resampled) at step {j.last_step}"
                )
    return out


def setting_key(trials: pa.Table, row: int) -> tuple:
    """The setting of a trials-table row within its batch size (:func:`setting_of`)."""
    return setting_of({c: trials.column(c)[row].as_py() for c in NUISANCE_COLUMNS if c in trials.column_names})


def _events(runs: Runs) -> tuple[list[dict], dict[int, np.ndarray]]:
    """Per trial, its fitted metrics' values by step, and the evaluation steps in order."""
    names = [n for n in runs.metric_names() if fitted_metric(n)]
    per: list[dict] = [dict() for _ in runs.trial_ids]
    for name in names:
        s = runs.series(name)
        for t, step, v in zip(s.trial.tolist(), s.step.tolist(), s.value.tolist(), strict=True):
            per[t].setdefault(step, {})[name] = v
    steps = {i: np.array(sorted(d)) for i, d in enumerate(per)}
    for i, st in enumerate(runs.status):  # a diverged trial ends at its first non-finite evaluation, as a live one
        if st == m.STATUS_DIVERGED:
            bad = [k for k, s in enumerate(steps[i]) if not np.isfinite(per[i][int(s)].get(m.EVAL_LOSS, np.nan))]
            if bad:
                steps[i] = steps[i][: bad[0] + 1]
    return per, steps


def _empty_curve(runs: Runs, i: int, status: str) -> Curve:
    """Trial row ``i`` of ``runs`` as the rule sees it, before any evaluation."""
    seed = int(runs.trials.column("seed")[i].as_py())
    return Curve(runs.trial_ids[i], int(runs.batch_size[i]), setting_key(runs.trials, i), seed, status)


def curves_from_runs(runs: Runs) -> list[Curve]:
    """Every trial of ``runs`` as the rule sees it, with all its evaluations and its recorded status."""
    per, steps = _events(runs)
    out = []
    for i in range(len(runs.trial_ids)):
        c = _empty_curve(runs, i, str(runs.status[i]))
        for s in steps[i]:
            for name, v in per[i][int(s)].items():
                c.add(int(s), name, v)
        out.append(c)
    return out
