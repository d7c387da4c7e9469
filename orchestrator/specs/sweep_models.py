"""The sweep spec's typed model (``SweepModel``: its sections, their keys, types and ranges, and every rule between
keys, as its validators), the source of the published JSON Schema (``bcrit schema sweep``,
docs/schema/sweep.schema.json). The values of ``fixed`` and the trial's stopping keys carry their schema here and are
checked with the workload's trial config (orchestrator.execution.preflight)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from analysis.core.device_share import share_error
from orchestrator.specs.adaptive_spec import Adaptive, Budget, Goal, adaptive
from orchestrator.specs.models import SpecModel, field, required, rule
from trainables import workloads

PosInt = Annotated[int, Field(ge=1)]
NUMBER = {"type": "number"}
NUMBERS = {"anyOf": [NUMBER, {"type": "array", "items": NUMBER, "minItems": 1}]}
RANGE = {"type": "object", "properties": {"low": NUMBER, "high": NUMBER}, "required": ["low", "high"],
         "additionalProperties": False}  # fmt: skip
PER_B = {"type": "object", "additionalProperties": {"type": "integer"}}
SAMPLERS = ("uniform", "noise", "loss")
SPLIT_KEYS = ("micro_batch_size", "grad_accum", "num_workers")
NUISANCE_PARAMS = ("lr", "warmup_steps", "beta2", "weight_decay")
TRIAL_STOPPING = ("target_loss", "max_steps", "divergence_factor")  # the stopping keys of the trials' configs
# trial-config keys owned by other sections (a clear error instead of a silent conflict)
OWNED = {
    "batch_size": "scientific.batch_sizes",
    **{k: "scientific.splits" for k in SPLIT_KEYS},
    "use_gpu": "scientific.use_gpu",
    "cpus_per_worker": "scientific.cpus_per_worker",
    "gpus_per_worker": "scientific.gpus_per_worker",
    **{k: f"nuisance.{k}" for k in NUISANCE_PARAMS},
    **{k: f"stopping.{k}" for k in TRIAL_STOPPING},
    "seed": "fixed.seeds",
}
# fixed keys that may be given per batch size ({batch size: value}): the evaluation cadence, so that every batch size
# has >= 10 evaluations before its crossing (flag coarse_steps) without evaluating the small, slow ones every step
PER_BATCH_SIZE_FIXED = ("eval_every",)
# stopping keys that may be given per batch size: the step budget, so that slow learning rates at large batch sizes
# stop soon after the best known steps instead of running the small batch sizes' budget
PER_BATCH_SIZE_STOPPING = ("max_steps",)


def schema_only(schema: dict, description: str) -> Any:
    """A key checked elsewhere or by a validator (its value passes through the type), with its JSON Schema."""
    return Annotated[Any, WithJsonSchema({**schema, "description": description})]


def _name(v: Any, info: ValidationInfo) -> str:
    """``name``: one path component (stripped); the line names the spec's file (context ``source``, ``example``)."""
    if not isinstance(v, str) or not v.strip() or "/" in v:
        ctx = info.context or {}
        raise rule(f"{ctx.get('source', 'spec')}: 'name' must be a non-empty string without '/', "
                   f"e.g. name: {ctx.get('example', 'tiny')}")  # fmt: skip
    return v.strip()


def _workload(v: Any) -> str:
    """``workload``: a name of `trainables.workloads.BUILTIN` or ``module:attr``, imported here (a mistake is found
    before any compute)."""
    if not workloads.known(v):
        raise rule(workloads.unknown_message(v))
    if v not in workloads.BUILTIN:
        try:
            workloads.get_workload(v)
        except workloads.ConfigError as e:
            raise rule(str(e)) from None
    return v


Name = Annotated[str, BeforeValidator(_name)]
WorkloadName = Annotated[str, BeforeValidator(_workload)]


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
        return self.lr is None or any(same(point.get("lr"), x) for x in self.lr)


def same(a: Any, b: float) -> bool:
    """Whether ``a`` is the number ``b`` (to rounding)."""
    return isinstance(a, (int, float)) and abs(float(a) - b) <= 1e-12 * max(abs(b), 1e-300)


class SplitKeys(SpecModel):
    """How one batch size is reached: micro_batch_size x grad_accum x max(1, num_workers)."""

    micro_batch_size: PosInt | None = field(None, fix="must be an integer >= 1")
    grad_accum: PosInt = field(1, fix="must be an integer >= 1")
    num_workers: Annotated[int, Field(ge=0)] = field(0, fix="must be an integer >= 0")

    def split(self, b: int, where: str) -> Split:
        """The split reaching batch size ``b`` (micro_batch_size derived where omitted), or the `rule` it breaks
        (``where``: its key)."""
        per = self.grad_accum * max(1, self.num_workers)
        if self.micro_batch_size is None and b % per:
            raise rule(
                f"{where}: batch size {b} is not divisible by grad_accum x workers = {per}; "
                f"use a batch size that is a multiple of {per} or another split"
            )
        micro = b // per if self.micro_batch_size is None else self.micro_batch_size
        if micro * per != b:
            raise rule(
                f"{where}: micro_batch_size {micro} x grad_accum {self.grad_accum} x workers "
                f"{max(1, self.num_workers)} = {micro * per} != batch size {b}; fix the split or drop "
                "micro_batch_size to derive it"
            )
        lr = getattr(self, "lr", None)
        lrs = None if lr is None else tuple(float(x) for x in (lr if isinstance(lr, list) else [lr]))
        return Split(micro, self.grad_accum, self.num_workers, lrs, getattr(self, "num_seeds", None))


class SplitModel(SplitKeys):
    """How one batch size is reached (micro_batch_size x grad_accum x max(1, num_workers)), optionally at some grid
    learning rates or the first seeds only."""

    lr: Annotated[float, Field(gt=0)] | Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=1)] | None = (
        field(None, fix="must be a learning rate of nuisance.lr or a list of them")
    )
    num_seeds: PosInt | None = field(None, fix="must be an integer >= 1")


class Scientific(SpecModel):
    """The variable under study: the effective batch sizes and how each is reached."""

    batch_sizes: Annotated[list[PosInt], Field(min_length=1)] = field(
        fix="must be a non-empty list of distinct integers >= 1, e.g. [16, 32, 64, 128]"
    )
    splits: Annotated[list[SplitModel], Field(min_length=1)] = field(
        [SplitModel()], fix="must be a non-empty list like [{grad_accum: 1, num_workers: 0}]"
    )
    per_batch_size: dict[int | str, Annotated[list[SplitModel], Field(min_length=1)]] | None = field(
        None, fix="must map a batch size to its list of splits"
    )
    use_gpu: bool = field(False, fix="must be true or false")
    cpus_per_worker: PosInt = field(1, fix="must be an integer >= 1")
    gpus_per_worker: schema_only(
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "with use_gpu: the share of a GPU each worker holds"
    ) = 1
    timestep_sampling: Literal[SAMPLERS] | Annotated[list[Literal[SAMPLERS]], Field(min_length=1)] | None = field(
        None, fix=f"must be a list of distinct samplers of {list(SAMPLERS)}"
    )  # compared over the same grid (docs/allocation.md)
    _splits: dict[int, tuple[Split, ...]] = PrivateAttr()  # batch size -> its splits

    @field_validator("batch_sizes", "timestep_sampling")
    @classmethod
    def _distinct(cls, v: Any) -> Any:
        if isinstance(v, list) and len(set(v)) != len(v):
            raise ValueError("duplicates")
        return v

    @field_validator("gpus_per_worker")
    @classmethod
    def _share(cls, v: Any) -> float:
        """A number in (0, 1]: Ray places fractional GPUs; above 1 a DDP worker would hold GPUs it cannot use."""
        if why := share_error("scientific.gpus_per_worker", v):
            raise rule(why)
        return float(v)

    @model_validator(mode="after")
    def _splits_reach_the_batch_sizes(self) -> Scientific:
        per_b = self.per_batch_size or {}
        extra = [k for k in per_b if not str(k).isdigit() or int(k) not in self.batch_sizes]
        if extra:
            raise rule(f"scientific.per_batch_size.{extra[0]} is not in scientific.batch_sizes; add it there")
        self._splits = {}
        for b in self.batch_sizes:
            key = next((k for k in per_b if str(k) == str(b)), None)
            given, where = (
                (self.splits, "scientific.splits") if key is None else (per_b[key], f"scientific.per_batch_size.{b}")
            )
            self._splits[b] = tuple(s.split(b, f"{where}[{i}]") for i, s in enumerate(given))
        return self

    def samplers(self) -> tuple[str, ...]:
        v = self.timestep_sampling
        return () if v is None else tuple([v] if isinstance(v, str) else v)


class Nuisance(SpecModel):
    """Re-tuned per batch size: a grid, an Optuna study, or the adaptive design's lr grid."""

    model_config = required("lr")

    search: Literal["grid", "optuna", "adaptive"] = field("grid", fix="must be 'grid', 'optuna' or 'adaptive'")
    lr: schema_only({"anyOf": [*NUMBERS["anyOf"], RANGE]}, "grid, adaptive: values; optuna: {low, high}") = None
    warmup_steps: schema_only({"anyOf": [*NUMBERS["anyOf"], RANGE]}, "grid: values; optuna: {low, high}") = None
    beta2: schema_only({"anyOf": [*NUMBERS["anyOf"], RANGE]}, "grid: values; optuna: {low, high}") = None
    weight_decay: schema_only({"anyOf": [*NUMBERS["anyOf"], RANGE]}, "grid: values; optuna: {low, high}") = None
    trials_per_batch_size: PosInt = field(8, fix="must be an integer >= 1")
    seed: Annotated[int, Field(ge=0)] = field(0, fix="must be an integer >= 0")
    goal: Goal | None = field(None, fix="search: adaptive: when the sweep has its answer")
    budget: Budget | None = field(None, fix="search: adaptive: the most it may spend")

    @field_validator(*NUISANCE_PARAMS)
    @classmethod
    def _by_search(cls, v: Any, info: ValidationInfo) -> Any:
        """grid, adaptive: a list of numbers; optuna: a range ``(low, high)`` or a constant."""
        k, search = info.field_name, info.data.get("search", "grid")
        if search in ("grid", "adaptive"):
            v = v if isinstance(v, list) else [v]
            if not v or not all(_num(x) for x in v):
                raise rule(f"nuisance.{k} must be a number or a non-empty list of numbers for search: {search}")
            return v
        if _num(v):
            return v
        if not isinstance(v, dict):
            raise rule(f"nuisance.{k} must be {{low, high}} or a constant for search: optuna, got {v!r}")
        if unknown := [x for x in v if x not in ("low", "high")]:
            raise rule(f"unknown key nuisance.{k}.{unknown[0]}; valid keys of nuisance.{k}: ['low', 'high']")
        lo, hi = v.get("low"), v.get("high")
        if not (_num(lo) and _num(hi)) or not lo < hi:
            raise rule(f"nuisance.{k} needs numbers low < high, got {v!r}")
        if k in ("lr", "weight_decay") and lo <= 0:
            raise rule(f"nuisance.{k}.low must be > 0 (searched on a log scale), got {lo}")
        return (lo, hi)

    @model_validator(mode="after")
    def _keys_of_the_search(self) -> Nuisance:
        search, given = self.search, self.model_fields_set
        if search != "adaptive" and (self.goal is not None or self.budget is not None):
            raise rule("nuisance.goal and nuisance.budget are for search: adaptive; drop them or set it")
        if "lr" not in given:
            raise rule("nuisance.lr is required (grid: a list of values; optuna: {low: 1e-4, high: 1e-2})")
        if search != "optuna" and "trials_per_batch_size" in given:
            raise rule(f"nuisance.trials_per_batch_size is for search: optuna, not {search}; drop it")
        if search == "optuna" and not isinstance(self.lr, tuple):
            raise rule("nuisance.lr must be a range {low, high} for search: optuna")
        if search != "adaptive":
            return self
        if many := [k for k, v in self.values().items() if k != "lr" and len(v) > 1]:
            raise rule(f"nuisance.{many[0]}: search: adaptive searches lr only; give it one value")
        if self.goal is None:
            raise rule("search: adaptive needs nuisance.goal, e.g. goal: {rel_ci: 0.15, targets: auto}")
        if self.budget is None or not self.budget.model_fields_set:
            raise rule("search: adaptive needs nuisance.budget, e.g. budget: {trials: 40} or {examples: 2.0e+6}")
        return self

    def values(self) -> dict[str, Any]:
        """grid, adaptive: name -> list of values; optuna: name -> (low, high) or a constant."""
        return {k: getattr(self, k) for k in NUISANCE_PARAMS if k in self.model_fields_set}


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Stopping(SpecModel):
    """When a trial stops (checked with the trial config), and whether the sweep stops the trials behind."""

    target_loss: schema_only(NUMBER, "stop at this eval loss") = None
    max_steps: schema_only({"anyOf": [{"type": "integer"}, PER_B]}, "steps, or {batch size: steps}") = None
    divergence_factor: schema_only(NUMBER, "stop when the loss exceeds this x its start") = None
    behind: bool = field(True, fix="must be true or false")


class Tracking(SpecModel):
    """Where MLflow records the sweep."""

    mlflow_uri: str | None = field(None, fix="must be a URI (sqlite:///PATH/mlflow.db or http://...)")
    experiment: Annotated[str, Field(pattern=r"\S")] | None = field(
        None, fix="must be a non-empty string (an MLflow experiment name)"
    )


class SweepModel(SpecModel):
    """A sweep spec (bcrit sweep SPEC; docs/sweeps.md)."""

    name: Name = field(fix="must be a non-empty string without '/'")
    workload: WorkloadName = field("dit", fix="must be dit, quadratic or module:attr")
    scientific: Scientific
    nuisance: Nuisance
    fixed: dict[str, Any] | None = field(None, fix="must be a mapping of trial-config keys to values")
    stopping: Stopping = Stopping()
    tracking: Tracking = Tracking()
    storage: Annotated[str, Field(pattern=r"\S")] | None = field(
        None, fix="must be a directory path or a URI (e.g. ./runs/tiny or s3://bucket/runs/tiny)"
    )
    _fixed: dict[str, Any] = PrivateAttr()  # the trial-config keys of every trial (per batch size: {B: value})
    _seeds: tuple[int, ...] = PrivateAttr()
    _stopping: dict[str, Any] = PrivateAttr()  # the trials' stopping keys (per batch size: {B: value})
    _adaptive: Adaptive | None = PrivateAttr(None)

    @field_validator("fixed")
    @classmethod
    def _not_owned(cls, v: dict[str, Any]) -> dict[str, Any]:
        if owned := [k for k in OWNED if k in v]:
            raise rule(f"fixed.{owned[0]} is set by {OWNED[owned[0]]}; move it there")
        seeds = [v["seeds"]] if isinstance(v.get("seeds"), int) else v.get("seeds", [0])
        if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
            raise rule(f"fixed.seeds must be a non-negative integer or a list of them, got {seeds!r}")
        return v

    @model_validator(mode="after")
    def _sections_agree(self) -> SweepModel:
        """The rules between sections: per-batch-size values, the splits' lrs and seeds, what search: adaptive and
        scientific.timestep_sampling need."""
        sci, nui, fixed, stop = self.scientific, self.nuisance, dict(self.fixed or {}), self.stopping
        seeds = fixed.pop("seeds", [0])
        self._seeds = tuple([seeds] if isinstance(seeds, int) else seeds)
        self._fixed = _per_batch_size(fixed, PER_BATCH_SIZE_FIXED, sci.batch_sizes, "fixed")
        trial_stop = {k: getattr(stop, k) for k in TRIAL_STOPPING if k in stop.model_fields_set}
        self._stopping = _per_batch_size(trial_stop, PER_BATCH_SIZE_STOPPING, sci.batch_sizes, "stopping")
        for b, ss in sci._splits.items():
            for s in ss:
                _split_subsets(s, b, nui, len(self._seeds))
        if nui.search == "adaptive":
            if len(sci.batch_sizes) < 3:
                raise rule(f"search: adaptive needs >= 3 scientific.batch_sizes to fit B_crit, got {sci.batch_sizes}")
            if many := [b for b in sci.batch_sizes if len(sci._splits[b]) > 1]:
                raise rule(f"search: adaptive runs one split per batch size; batch size {many[0]} has several")
            self._adaptive = adaptive(nui.goal, nui.budget, len(self._seeds), stop.target_loss)
        if sci.timestep_sampling is not None and "timestep_sampling" in fixed:
            raise rule("fixed.timestep_sampling is set by scientific.timestep_sampling; keep one of them")
        if sci.timestep_sampling is not None and nui.search != "grid":
            raise rule("scientific.timestep_sampling compares samplers on one grid; use nuisance.search: grid")
        return self


def _per_batch_size(section: dict, keys: tuple[str, ...], batch_sizes: list[int], where: str) -> dict[str, Any]:
    """``section`` with each of its ``keys`` given as ``{batch size: value}`` covering every batch size of the sweep
    (keys may be strings of integers) read as ``{int: value}``."""
    out = dict(section)
    for key in keys:
        if not isinstance(section.get(key), dict):
            continue
        per = {}
        for k, x in section[key].items():
            if not str(k).isdigit() or int(k) not in batch_sizes:
                raise rule(f"{where}.{key}.{k} is not in scientific.batch_sizes {batch_sizes}; use those batch "
                           "sizes as keys")  # fmt: skip
            per[int(k)] = x
        if missing := [b for b in batch_sizes if b not in per]:
            raise rule(f"{where}.{key} has no value for batch size {missing[0]}; give one per batch size, or one "
                       "number")  # fmt: skip
        out[key] = per
    return out


def _split_subsets(s: Split, b: int, nui: Nuisance, n_seeds: int) -> None:
    """A split's ``lr`` subset (grid search only, values of ``nuisance.lr``) and ``num_seeds`` (at most the number
    of ``fixed.seeds``)."""
    if s.lr is not None:
        where = f"the lr of split {s.label()} at batch size {b}"
        if nui.search != "grid":
            raise rule(f"{where}: a split's lr subset needs search: grid; drop it for optuna")
        if missing := [x for x in s.lr if not any(same(g, x) for g in nui.lr)]:
            raise rule(f"{where}: {missing[0]:g} is not in nuisance.lr {nui.lr}; use values of the grid")
    if s.num_seeds is not None and s.num_seeds > n_seeds:
        raise rule(
            f"num_seeds {s.num_seeds} of split {s.label()} at batch size {b} exceeds the {n_seeds} seed(s) of "
            "fixed.seeds; use at most that many, or drop num_seeds to run every seed"
        )
