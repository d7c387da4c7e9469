"""The sweep spec: one YAML file in the tuning playbook's vocabulary, validated before anything is launched.

```yaml
name: tiny                        # sweep name: MLflow parent run, default storage ./runs/<name>
workload: dit                     # dit (default) | quadratic (the noisy quadratic model, seconds per trial) |
                                  # module:attr of your own trainables.workloads.Workload
scientific:                       # the variable under study: effective batch size B = micro x A x W
  batch_sizes: [16, 32, 64, 128]
  splits: [{grad_accum: 1, num_workers: 0}]  # every B runs these; micro_batch_size = B / (A x W) when omitted
  per_batch_size:                 # replaces `splits` for one B (add accumulation / multi-worker variants)
    64: [{grad_accum: 1, num_workers: 0}, {grad_accum: 2, num_workers: 0}, {grad_accum: 1, num_workers: 2, lr: 2.0e-3}]
                                  # lr (grid search): run that split at these grid values only (a cheaper check)
                                  # num_seeds: run that split at the first N of fixed.seeds only (a cheaper check;
                                  # bcrit analyze pools the splits of one seed into one repeat)
  use_gpu: false
  cpus_per_worker: 1
  gpus_per_worker: 1              # with use_gpu: the share of a GPU each worker holds; 0.25 runs 4 on one GPU
nuisance:                         # re-tuned per batch size
  search: grid                    # grid: lists of values | optuna: TPE, ranges {low, high} |
                                  # adaptive: trials chosen by the B_crit interval (orchestrator.specs.adaptive_spec)
  lr: [2.0e-3, 6.0e-3]            # optuna: {low: 1.0e-4, high: 1.0e-2} (log scale)
  trials_per_batch_size: 8        # optuna only
fixed: {preset: tiny, dataset: digits, seeds: [0], eval_every: 10}   # any other trial-config keys
                                  # eval_every may be {batch size: steps} (one per batch size)
stopping: {target_loss: 0.2, max_steps: 100, divergence_factor: 3.0}   # max_steps may be {batch size: steps}
tracking: {mlflow_uri: null, experiment: bcrit}   # null: $MLFLOW_TRACKING_URI, else sqlite in the sweep dir
storage: ./runs/tiny
```
Every mistake raises one `UserError` line naming the key and the fix.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

from analysis.core.device_share import share_error
from orchestrator.errors import UserError
from orchestrator.specs.adaptive_spec import Adaptive, parse_adaptive
from orchestrator.specs.models import SpecModel, validate
from orchestrator.specs.sweep_models import Nuisance, Scientific, SplitModel, Stopping, SweepModel, Tracking
from orchestrator.specs.yaml_overrides import apply_overrides, dump_yaml, load_yaml
from orchestrator.storage.layout import MLFLOW_DB, SweepLayout
from orchestrator.storage.uri import is_uri, local_dir
from trainables import workloads

TOP_KEYS = tuple(SweepModel.model_fields)
SCIENTIFIC_KEYS = tuple(Scientific.model_fields)
SPLIT_KEYS = ("micro_batch_size", "grad_accum", "num_workers")
NUISANCE_PARAMS = ("lr", "warmup_steps", "beta2", "weight_decay")
NUISANCE_KEYS = tuple(Nuisance.model_fields)
STOPPING_KEYS = tuple(Stopping.model_fields)
SWEEP_STOPPING_KEYS = ("behind",)  # stopping keys of the sweep, not of its trials' configs
STOP_BEHIND_DEFAULT = True  # pinned in the saved spec (_saved)
TRACKING_KEYS = tuple(Tracking.model_fields)
# trial-config keys owned by other sections (a clear error instead of a silent conflict)
OWNED = {
    "batch_size": "scientific.batch_sizes",
    **{k: "scientific.splits" for k in SPLIT_KEYS},
    "use_gpu": "scientific.use_gpu",
    "cpus_per_worker": "scientific.cpus_per_worker",
    "gpus_per_worker": "scientific.gpus_per_worker",
    **{k: f"nuisance.{k}" for k in NUISANCE_PARAMS},
    **{k: f"stopping.{k}" for k in STOPPING_KEYS if k not in SWEEP_STOPPING_KEYS},
    "seed": "fixed.seeds",
}
# fixed keys that may be given per batch size ({batch size: value}): the evaluation cadence, so that every batch size
# has >= 10 evaluations before its crossing (flag coarse_steps) without evaluating the small, slow ones every step
PER_BATCH_SIZE_FIXED = ("eval_every",)
# stopping keys that may be given per batch size: the step budget, so that slow learning rates at large batch sizes
# stop soon after the best known steps instead of running the small batch sizes' budget
PER_BATCH_SIZE_STOPPING = ("max_steps",)


@dataclass(frozen=True)
class Split:
    """How one effective batch size is reached: micro-batch x accumulation x workers (0 workers = in-process)."""

    micro_batch_size: int
    grad_accum: int
    num_workers: int
    # grid search only: run this split at these learning rates of the grid only (None: at every grid point). A
    # split variant checks that B, not its split, sets the result: one lr of the grid shows it at a fraction of
    # the cost (a 2-worker trial costs ~10x an in-process one on a small machine: Ray Train's worker group)
    lr: tuple[float, ...] | None = None
    # run this split at the first ``num_seeds`` of the sweep's seeds only (None: every seed). The splits of one seed
    # are one repeat to `bcrit analyze` (analysis.fits.steps.pool_splits), so a variant run at fewer seeds joins the
    # repeats of the seeds it ran and shows the split invariance there, without a 2-worker trial per seed
    num_seeds: int | None = None

    def label(self) -> str:
        return f"{self.micro_batch_size}x{self.grad_accum}x{max(1, self.num_workers)}"

    def config(self) -> dict[str, int]:
        """The trial-config keys of the split."""
        return {"micro_batch_size": self.micro_batch_size, "grad_accum": self.grad_accum,
                "num_workers": self.num_workers}  # fmt: skip

    def runs(self, point: dict[str, Any]) -> bool:
        """Whether this split runs at grid point ``point``."""
        return self.lr is None or any(_same(point.get("lr"), x) for x in self.lr)


def _same(a: Any, b: float) -> bool:
    return isinstance(a, (int, float)) and abs(float(a) - b) <= 1e-12 * max(abs(b), 1e-300)


@dataclass(frozen=True)
class SweepSpec:
    name: str
    workload: str
    batch_sizes: tuple[int, ...]
    splits: dict[int, tuple[Split, ...]]  # batch size -> its splits
    use_gpu: bool
    cpus_per_worker: int
    search: str  # "grid" | "optuna" | "adaptive"
    nuisance: dict[str, Any]  # grid, adaptive: name -> list of values; optuna: name -> (low, high) or a constant
    trials_per_batch_size: int  # optuna only
    search_seed: int
    fixed: dict[str, Any]  # trial-config keys shared by every trial (without seeds)
    seeds: tuple[int, ...]
    stopping: dict[str, Any]
    mlflow_uri: str
    experiment: str
    sweep_dir: str
    raw: dict = field(compare=False, repr=False)  # the resolved YAML (saved in the sweep dir, logged to MLflow)
    samplers: tuple[
        str, ...
    ] = ()  # scientific.timestep_sampling: every trial runs once per sampler (docs/allocation.md)
    gpus_per_worker: float = 1.0  # scientific.gpus_per_worker: the share of one GPU a worker holds (use_gpu)
    storage_uri: str | None = None  # storage as a URI (s3://...): Ray's files there, bcrit's in sweep_dir, mirrored
    # stopping.behind: stop the trials the fit only needs to know are slower (analysis.features.stop_behind); it
    # acts only where trials have a target_loss to reach
    stop_behind: bool = True

    @property
    def layout(self) -> SweepLayout:
        """Where each of the sweep's files lives (its directory, and its URI storage if any)."""
        return SweepLayout(self.sweep_dir, self.storage_uri)

    @property
    def storage_root(self) -> str:
        """Where Ray Tune and Ray Train write (RunConfig storage_path): the URI, else the sweep directory."""
        return self.storage_uri or self.sweep_dir

    adaptive: Adaptive | None = None  # search: adaptive only: its goal and budget

    # --- trial configs -----------------------------------------------------------------------------------
    def base_config(self, batch_size: int, split: Split, seed: int) -> dict[str, Any]:
        """The trial-config dict of one (batch size, split, seed) before the nuisance values are filled in."""
        return {
            **{
                k: v[batch_size] if k in PER_BATCH_SIZE_FIXED and isinstance(v, dict) else v
                for k, v in self.fixed.items()
            },  # fmt: skip
            **{
                k: v[batch_size] if k in PER_BATCH_SIZE_STOPPING and isinstance(v, dict) else v
                for k, v in self.stopping.items()
                if v is not None
            },  # fmt: skip
            "batch_size": batch_size,
            **split.config(),
            "use_gpu": self.use_gpu,
            "cpus_per_worker": self.cpus_per_worker,
            **({"gpus_per_worker": self.gpus_per_worker} if self.gpus_per_worker != 1 else {}),
            "seed": seed,
        }

    def groups(self) -> list[tuple[int, Split, int]]:
        """Every (batch size, split, seed) combination, in spec order."""
        return [(b, s, seed) for b in self.batch_sizes for s in self.splits[b] for seed in self.seeds[: s.num_seeds]]

    def grid_points(self) -> list[dict[str, Any]]:
        """Nuisance values of a grid search (the cartesian product; adaptive: the grid it draws from); [] for
        optuna."""
        if self.search == "optuna":
            return []
        names = list(self.nuisance)
        return [dict(zip(names, vals, strict=True)) for vals in itertools.product(*self.nuisance.values())]

    def trial_configs(self) -> list[dict[str, Any]]:
        """All trial-config dicts of a grid sweep; for optuna, one representative per group and nuisance corner
        (low and high ends of every range), which is what validation needs."""
        points = self.grid_points() or self._optuna_corners()
        samplers = [{"timestep_sampling": x} for x in self.samplers] or [{}]
        return [{**self.base_config(b, s, seed), **x, **p}
                for b, s, seed in self.groups() for x in samplers for p in points if s.runs(p)]  # fmt: skip

    def _optuna_corners(self) -> list[dict[str, Any]]:
        ends = [list(v) if isinstance(v, tuple) else [v] for v in self.nuisance.values()]
        return [dict(zip(self.nuisance, vals, strict=True)) for vals in itertools.product(*ends)]

    def num_trials(self) -> int:
        """The sweep's trials (adaptive: the most it may run, its trial budget or its whole grid)."""
        if self.search in ("grid", "adaptive"):  # the configs `trial_configs` makes, counted
            points = self.grid_points()
            space = max(1, len(self.samplers)) * sum(
                sum(1 for p in points if s.runs(p)) for _b, s, _seed in self.groups()
            )
            budget = self.adaptive.budget_trials if self.search == "adaptive" else None
            return space if budget is None else min(space, budget)
        return len(self.groups()) * self.trials_per_batch_size  # one study per group (batch size x split x seed)

    def to_yaml(self) -> str:
        return dump_yaml(self.raw)


# --- parsing ----------------------------------------------------------------------------------------------------
def load_spec(path: str, overrides: list[str] | None = None, *, sweep_dir: str | None = None) -> SweepSpec:
    """Read, override (``--set key=value``) and validate a sweep spec. Raises UserError."""
    return parse_spec(apply_overrides(load_yaml(path), overrides or []), sweep_dir=sweep_dir, source=path)


def name_and_workload(data: dict, source: str, example: str) -> tuple[str, str]:
    """The spec's ``name`` (one path component) and ``workload`` (a name of `trainables.workloads.BUILTIN` or
    ``module:attr``, imported here: a mistake is found before any compute), or one UserError line."""
    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise UserError(f"{source}: 'name' must be a non-empty string without '/', e.g. name: {example}")
    workload = data.get("workload", workloads.DEFAULT)
    if not workloads.known(workload):
        raise UserError(workloads.unknown_message(workload))
    if workload not in workloads.BUILTIN:
        try:
            workloads.get_workload(workload)
        except workloads.ConfigError as e:
            raise UserError(str(e)) from None
    return name, workload


def parse_spec(data: dict, *, sweep_dir: str | None = None, source: str = "spec") -> SweepSpec:
    if isinstance(data, dict) and data.get("kind") == "branched":  # orchestrator.features.branched.branch_study
        raise UserError(f"{source} is a branched study (kind: branched); run it with bcrit branch {source}")
    _keys(data, TOP_KEYS, "")
    name, workload = name_and_workload(data, source, example="tiny")
    name = name.strip()
    sci = _section(data, "scientific", Scientific, required=True)
    nui = _section(data, "nuisance", Nuisance, required=True)
    fixed = dict(_section(data, "fixed", None))
    stop = _section(data, "stopping", Stopping)
    track = _section(data, "tracking", Tracking)

    batch_sizes = _batch_sizes(sci.get("batch_sizes"))
    default_splits = _splits(sci.get("splits", [{"grad_accum": 1, "num_workers": 0}]), "scientific.splits")
    per_b = sci.get("per_batch_size") or {}
    splits: dict[int, tuple[Split, ...]] = {}
    for b in batch_sizes:
        raw_splits = per_b.get(b, per_b.get(str(b)))
        given = _splits(raw_splits, f"scientific.per_batch_size.{b}") if raw_splits is not None else default_splits
        splits[b] = tuple(_resolve_split(b, s, where) for s, where in given)
    extra_b = [k for k in per_b if not str(k).isdigit() or int(k) not in batch_sizes]
    if extra_b:
        raise UserError(f"scientific.per_batch_size.{extra_b[0]} is not in scientific.batch_sizes; add it there")

    for key, where in OWNED.items():
        if key in fixed:
            raise UserError(f"fixed.{key} is set by {where}; move it there")
    for key in PER_BATCH_SIZE_FIXED:
        if isinstance(fixed.get(key), dict):
            fixed[key] = _per_batch_size(fixed[key], batch_sizes, f"fixed.{key}")
    stop = dict(stop)
    for key in PER_BATCH_SIZE_STOPPING:
        if isinstance(stop.get(key), dict):
            stop[key] = _per_batch_size(stop[key], batch_sizes, f"stopping.{key}")
    seeds = [s] if isinstance(s := fixed.pop("seeds", [0]), int) else s
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise UserError(f"fixed.seeds must be a non-negative integer or a list of them, got {seeds!r}")

    search, nuisance, trials_per_b = _nuisance(nui)
    _check_split_lrs(splits, search, nuisance)
    _check_split_seeds(splits, len(seeds))
    storage_uri, sweep_dir = _storage(data.get("storage"), name, sweep_dir)
    uri = track.get("mlflow_uri")
    uri = (os.environ.get("MLFLOW_TRACKING_URI") or local_mlflow_uri(sweep_dir)) if uri is None else uri
    experiment = track.get("experiment")
    experiment = "bcrit" if experiment is None else experiment
    stopping = _stopping(stop)
    adaptive = _adaptive(nui, stop, seeds, batch_sizes, splits, nuisance) if search == "adaptive" else None
    return SweepSpec(
        name=name,
        workload=workload,
        batch_sizes=tuple(batch_sizes),
        splits=splits,
        use_gpu=sci.get("use_gpu", False),
        cpus_per_worker=sci.get("cpus_per_worker", 1),
        gpus_per_worker=_gpu_share(sci.get("gpus_per_worker", 1)),
        search=search,
        nuisance=nuisance,
        trials_per_batch_size=trials_per_b,
        search_seed=nui.get("seed", 0),
        fixed=fixed,
        seeds=tuple(seeds),
        **stopping,
        mlflow_uri=uri,
        experiment=experiment,
        sweep_dir=sweep_dir,
        raw=_saved(
            data, name, storage_uri or sweep_dir, {"mlflow_uri": uri, "experiment": experiment}, stopping, adaptive
        ),  # fmt: skip
        samplers=_samplers(sci.get("timestep_sampling"), fixed, search),
        storage_uri=storage_uri,
        adaptive=adaptive,
    )


def _saved(data: dict, name: str, storage: str, tracking: dict, stopping: dict, adaptive: Adaptive | None) -> dict:
    """The spec as the sweep saves it (``spec.yaml`` in its directory, an artifact of its MLflow parent run): the YAML
    as given, with what it left to a default that decides how the sweep runs pinned to the value this bcrit used --
    the storage, the tracking URI and experiment, ``stopping.behind``, and an adaptive goal's ``bins``, ``min_seeds``,
    ``running`` and ``hold``. A sweep resumed from its directory then keeps the choices it started with after a
    later bcrit changes a default, and a YAML resumed against it must agree with them
    (orchestrator.specs.resume_rules.spec_to_run). A spec saved before a key was pinned reads it with the current
    default."""
    raw = {**data, "name": name, "storage": storage, "tracking": tracking}
    raw["stopping"] = {**(data.get("stopping") or {}), "behind": stopping["stop_behind"]}
    if adaptive is not None:
        goal = {**data["nuisance"]["goal"], "bins": adaptive.bins, "min_seeds": adaptive.min_seeds}
        goal |= {"running": "end" if adaptive.end_running else "wait", "hold": adaptive.hold}
        raw["nuisance"] = {**data["nuisance"], "goal": goal}
    return raw


def _adaptive(nui: dict, stop: dict, seeds: list, batch_sizes: list, splits: dict, nuisance: dict) -> Adaptive:
    """``search: adaptive``'s goal and budget, and what its space needs: >= 3 batch sizes, one split each, one
    value of every nuisance parameter but ``lr``."""
    if len(batch_sizes) < 3:
        raise UserError(f"search: adaptive needs >= 3 scientific.batch_sizes to fit B_crit, got {batch_sizes}")
    many = [b for b in batch_sizes if len(splits[b]) > 1]
    if many:
        raise UserError(f"search: adaptive runs one split per batch size; batch size {many[0]} has several")
    fixed_many = [k for k, v in nuisance.items() if k != "lr" and len(v) > 1]
    if fixed_many:
        raise UserError(f"nuisance.{fixed_many[0]}: search: adaptive searches lr only; give it one value")
    return parse_adaptive(nui, stop, len(seeds))


def _samplers(v: Any, fixed: dict, search: str) -> tuple[str, ...]:
    """``scientific.timestep_sampling``: a list of samplers compared over the same grid (docs/allocation.md)."""
    if v is None:
        return ()
    v = [v] if isinstance(v, str) else v
    known = ("uniform", "noise", "loss")
    if not isinstance(v, list) or not v or any(x not in known for x in v) or len(set(v)) != len(v):
        raise UserError(f"scientific.timestep_sampling must be a list of distinct samplers of {list(known)}, got {v!r}")
    if "timestep_sampling" in fixed:
        raise UserError("fixed.timestep_sampling is set by scientific.timestep_sampling; keep one of them")
    if search != "grid":
        raise UserError("scientific.timestep_sampling compares samplers on one grid; use nuisance.search: grid")
    return tuple(v)


def _storage(storage, name: str, sweep_dir: str | None) -> tuple[str | None, str]:
    """``(storage URI or None, the sweep's local directory)`` of the spec's ``storage`` (default runs/<name>): a URI's
    local directory is orchestrator.storage.uri.local_dir (unless ``sweep_dir`` says where it is)."""
    storage = os.path.join("runs", name) if storage is None else storage
    if not isinstance(storage, str) or not storage.strip():
        raise UserError("storage must be a directory path or a URI, e.g. storage: ./runs/tiny or s3://bucket/runs/tiny")
    storage_uri = storage.strip() if is_uri(storage) else None  # checked (opened, probed) before launch
    return storage_uri, os.path.abspath(sweep_dir or (local_dir(storage_uri) if storage_uri else storage))


def local_mlflow_uri(sweep_dir: str) -> str:
    """The embedded default tracking store: SQLite in the sweep dir, written only by the sweep driver."""
    return f"sqlite:///{os.path.join(os.path.abspath(sweep_dir), MLFLOW_DB)}"


def _keys(d: Any, allowed: tuple[str, ...] | None, where: str) -> None:
    if not isinstance(d, dict):
        raise UserError(f"{where or 'spec'} must be a mapping of keys to values")
    if allowed is None:
        return
    unknown = [k for k in d if k not in allowed]
    if unknown:
        prefix = f"{where}." if where else ""
        scope = f" of {where}" if where else ""
        raise UserError(f"unknown key {prefix}{unknown[0]}; valid keys{scope}: {list(allowed)}")


def _section(data: dict, name: str, allowed: tuple[str, ...] | type[SpecModel] | None, required: bool = False) -> dict:
    """Section ``name`` of ``data`` ({} where absent), its keys ``allowed`` (None: any) or checked by a model."""
    if name not in data or data[name] is None:
        if required:
            raise UserError(f"missing section '{name}'; see examples/tiny.yaml")
        return {}
    if isinstance(allowed, type):
        _keys(data[name], None, name)
        validate(allowed, data[name], name, scoped=True)
    else:
        _keys(data[name], allowed, name)
    return data[name]


def _pos_int(v: Any, where: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise UserError(f"{where} must be an integer >= {minimum}, got {v!r}")
    return v


def _gpu_share(v: Any) -> float:
    """``scientific.gpus_per_worker``: a number in (0, 1] (Ray places fractional GPUs; above 1 a DDP worker would
    hold GPUs it cannot use)."""
    if why := share_error("scientific.gpus_per_worker", v):
        raise UserError(why)
    return float(v)


def _stopping(stop: dict) -> dict[str, Any]:
    """The spec's ``stopping`` section as SweepSpec fields: the trials' keys, and the sweep's ``behind``."""
    trials = {k: stop.get(k) for k in STOPPING_KEYS if k in stop and k not in SWEEP_STOPPING_KEYS}
    return {"stopping": trials, "stop_behind": stop.get("behind", STOP_BEHIND_DEFAULT)}


def _batch_sizes(v: Any) -> list[int]:
    if not isinstance(v, list) or not v:
        raise UserError("scientific.batch_sizes must be a non-empty list of integers, e.g. [16, 32, 64, 128]")
    out = [_pos_int(b, "scientific.batch_sizes[]") for b in v]
    if len(set(out)) != len(out):
        raise UserError(f"scientific.batch_sizes has duplicates {out}; list each batch size once")
    return out


def _splits(v: list, where: str) -> list[tuple[dict, str]]:
    """The splits of ``where`` (a list the Scientific model checked), each with its key."""
    return [(s, f"{where}[{i}]") for i, s in enumerate(v)]


def _resolve_split(b: int, s: dict, where: str) -> Split:
    m = validate(SplitModel, s, where, scoped=True, batch_size=b, split_key=where)
    micro = m.micro_batch_size or b // (m.grad_accum * max(1, m.num_workers))
    return Split(micro, m.grad_accum, m.num_workers, m.lrs(), m.num_seeds)


def _per_batch_size(v: dict, batch_sizes: list[int], where: str) -> dict[int, Any]:
    """``{batch size: value}`` covering every batch size of the sweep (keys may be strings of integers)."""
    out = {}
    for k, x in v.items():
        if not str(k).isdigit() or int(k) not in batch_sizes:
            raise UserError(
                f"{where}.{k} is not in scientific.batch_sizes {batch_sizes}; use those batch sizes as keys"
            )
        out[int(k)] = x
    missing = [b for b in batch_sizes if b not in out]
    if missing:
        raise UserError(f"{where} has no value for batch size {missing[0]}; give one per batch size, or one number")
    return out


def _check_split_lrs(splits: dict[int, tuple[Split, ...]], search: str, nuisance: dict[str, Any]) -> None:
    """A split's ``lr`` subset: grid search only, and every value one of ``nuisance.lr``."""
    for b, ss in splits.items():
        for s in ss:
            if s.lr is None:
                continue
            where = f"the lr of split {s.label()} at batch size {b}"
            if search != "grid":
                raise UserError(f"{where}: a split's lr subset needs search: grid; drop it for optuna")
            grid = nuisance.get("lr")
            missing = [x for x in s.lr if not any(_same(g, x) for g in grid)]
            if missing:
                raise UserError(f"{where}: {missing[0]:g} is not in nuisance.lr {grid}; use values of the grid")


def _check_split_seeds(splits: dict[int, tuple[Split, ...]], n_seeds: int) -> None:
    """A split's ``num_seeds``: at most the number of ``fixed.seeds``."""
    for b, ss in splits.items():
        for s in ss:
            if s.num_seeds is not None and s.num_seeds > n_seeds:
                raise UserError(
                    f"num_seeds {s.num_seeds} of split {s.label()} at batch size {b} exceeds the {n_seeds} seed(s) of "
                    "fixed.seeds; use at most that many, or drop num_seeds to run every seed"
                )


def _nuisance(nui: dict) -> tuple[str, dict[str, Any], int]:
    search = nui.get("search", "grid")
    if search != "adaptive" and ("goal" in nui or "budget" in nui):
        raise UserError("nuisance.goal and nuisance.budget are for search: adaptive; drop them or set it")
    if "lr" not in nui:
        raise UserError("nuisance.lr is required (grid: a list of values; optuna: {low: 1e-4, high: 1e-2})")
    out: dict[str, Any] = {}
    for k in NUISANCE_PARAMS:
        if k not in nui:
            continue
        v = nui[k]
        if search in ("grid", "adaptive"):
            v = v if isinstance(v, list) else [v]
            if not v or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                raise UserError(f"nuisance.{k} must be a number or a non-empty list of numbers for search: {search}")
            out[k] = v
        elif isinstance(v, dict):
            _keys(v, ("low", "high"), f"nuisance.{k}")
            lo, hi = v.get("low"), v.get("high")
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (lo, hi)) or not lo < hi:
                raise UserError(f"nuisance.{k} needs numbers low < high, got {v!r}")
            if k in ("lr", "weight_decay") and lo <= 0:
                raise UserError(f"nuisance.{k}.low must be > 0 (searched on a log scale), got {lo}")
            out[k] = (lo, hi)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = v
        else:
            raise UserError(f"nuisance.{k} must be {{low, high}} or a constant for search: optuna, got {v!r}")
    if search != "optuna" and "trials_per_batch_size" in nui:
        raise UserError(f"nuisance.trials_per_batch_size is for search: optuna, not {search}; drop it")
    n = nui.get("trials_per_batch_size", 8) if search == "optuna" else 0
    if search == "optuna" and not isinstance(out["lr"], tuple):
        raise UserError("nuisance.lr must be a range {low, high} for search: optuna")
    return search, out, n
