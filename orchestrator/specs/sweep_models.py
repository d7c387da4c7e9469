"""The sweep spec's typed model (``SweepModel``: its sections, their keys, types and ranges, and the split rule),
the source of the published JSON Schema (``bcrit schema sweep``, docs/schema/sweep.schema.json). Keys whose values
another layer checks -- the nuisance values (by search), ``fixed`` and the trial's stopping keys (the workload's
trial config) -- carry their schema here and are checked there (orchestrator.specs.sweep_spec)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, WithJsonSchema, model_validator

from orchestrator.specs.adaptive_spec import Budget, Goal
from orchestrator.specs.models import SpecModel, field, required, rule

PosInt = Annotated[int, Field(ge=1)]
NUMBER = {"type": "number"}
NUMBERS = {"anyOf": [NUMBER, {"type": "array", "items": NUMBER, "minItems": 1}]}
RANGE = {"type": "object", "properties": {"low": NUMBER, "high": NUMBER}, "required": ["low", "high"],
         "additionalProperties": False}  # fmt: skip
PER_B = {"type": "object", "additionalProperties": {"type": "integer"}}


def schema_only(schema: dict, description: str) -> Any:
    """A key checked elsewhere (its value passes through the model), with its JSON Schema."""
    return Annotated[Any, WithJsonSchema({**schema, "description": description})]


class SplitKeys(SpecModel):
    """How one batch size is reached: micro_batch_size x grad_accum x max(1, num_workers)."""

    # validated with context batch_size and split_key (where the split is): the product must be that batch size
    micro_batch_size: PosInt | None = field(None, fix="must be an integer >= 1")
    grad_accum: PosInt = field(1, fix="must be an integer >= 1")
    num_workers: Annotated[int, Field(ge=0)] = field(0, fix="must be an integer >= 0")

    @model_validator(mode="after")
    def _reaches_the_batch_size(self, info: ValidationInfo) -> SplitKeys:
        ctx = info.context or {}
        if "batch_size" not in ctx:
            return self
        b, where, per = ctx["batch_size"], ctx["split_key"], self.grad_accum * max(1, self.num_workers)
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
        return self


class SplitModel(SplitKeys):
    """How one batch size is reached (micro_batch_size x grad_accum x max(1, num_workers)), optionally at some grid
    learning rates or the first seeds only."""

    lr: Annotated[float, Field(gt=0)] | Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=1)] | None = (
        field(None, fix="must be a learning rate of nuisance.lr or a list of them")
    )
    num_seeds: PosInt | None = field(None, fix="must be an integer >= 1")

    def lrs(self) -> tuple[float, ...] | None:
        return (
            None if self.lr is None else tuple(float(x) for x in (self.lr if isinstance(self.lr, list) else [self.lr]))
        )


class Scientific(SpecModel):
    """The variable under study: the effective batch sizes and how each is reached."""

    model_config = required("batch_sizes")

    batch_sizes: schema_only(
        {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
        "the effective batch sizes, e.g. [16, 32, 64, 128]",
    ) = None  # required (in the schema); checked by the spec parser
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
    timestep_sampling: schema_only(
        {"anyOf": [{"enum": ["uniform", "noise", "loss"]},
                   {"type": "array", "items": {"enum": ["uniform", "noise", "loss"]}, "minItems": 1}]},
        "samplers compared over the same grid (docs/allocation.md)",
    ) = None  # fmt: skip


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

    name: str = field(fix="must be a non-empty string without '/'")
    workload: str = field("dit", fix="must be dit, quadratic or module:attr")
    scientific: Scientific
    nuisance: Nuisance
    fixed: dict[str, Any] | None = field(None, fix="must be a mapping of trial-config keys to values")
    stopping: Stopping | None = None
    tracking: Tracking | None = None
    storage: str | None = field(None, fix="must be a directory path or a URI")
