"""The branched study's typed model (``BranchModel``: its sections, their keys, types and ranges), the source of the
published JSON Schema (``bcrit schema branch``, docs/schema/branch.schema.json). The rules between keys (a
multiplier that makes an integer batch size, examples a multiple of evals x k x B0, the kept checkpoints) are checked
by orchestrator.specs.branch_spec."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from analysis.core.lr_rules import LR_RULES
from analysis.features.branched.branched import COMPARE
from orchestrator.specs.models import SpecModel, field, required
from orchestrator.specs.sweep_models import NUMBER, PosInt, SplitKeys, Tracking, schema_only

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
SCALE_BY = ("micro_batch_size", "grad_accum", "num_workers")


class Reference(SpecModel):
    """The reference run the branches start from: its batch size B0, learning rate, seed and split."""

    batch_size: PosInt = field(fix="must be an integer >= 1")
    lr: Positive = field(fix="must be a positive number")
    seed: Annotated[int, Field(ge=0)] = field(0, fix="must be an integer >= 0")
    split: SplitKeys = field(SplitKeys(), fix="how B0 is reached")
    checkpoints: str | None = field(None, fix="must be a directory of kept checkpoints (step<N>/ inside)")
    use_gpu: bool = field(False, fix="must be true or false")
    cpus_per_worker: PosInt = field(1, fix="must be an integer >= 1")


class Branches(SpecModel):
    """Where the branches start, their batch sizes k x B0 and how far they train."""

    model_config = required("points", "multipliers", "examples")

    points: schema_only(
        {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1}]},
        "the reference's steps the branches start from",
    ) = None  # required (in the schema); checked by the spec parser
    multipliers: schema_only(
        {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0}, "minItems": 1},
        "the multipliers k of B0 (1 is added), e.g. [2, 4, 8]",
    ) = None  # required (in the schema); checked by the spec parser
    lr_rule: schema_only({"enum": list(LR_RULES)}, "how a branch's lr scales with k (default: the workload's)") = None
    examples: PosInt = field(fix="must be an integer >= 1")
    evals: PosInt = field(4, fix="must be an integer >= 1")
    seeds: schema_only(
        {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}]},
        "the branches' seeds",
    ) = None
    scale_by: Literal[SCALE_BY] = field("micro_batch_size", fix=f"must be one of {list(SCALE_BY)}")


class Analysis(SpecModel):
    """How the branches are compared."""

    epsilons: schema_only(
        {"anyOf": [NUMBER, {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1}]},
        "the loss tolerances, e.g. [0.01, 0.02, 0.05]",
    ) = None
    compare: Literal[COMPARE] = field("reference", fix=f"must be one of {list(COMPARE)}")
    window: schema_only(
        {"type": "number", "minimum": 0, "exclusiveMaximum": 1}, "the smoothing window, a fraction of examples"
    ) = None


class BranchStopping(SpecModel):
    """When a branch diverges."""

    divergence_factor: schema_only(NUMBER, "stop when the loss exceeds this x its start") = None


class BranchModel(SpecModel):
    """A branched study (bcrit branch SPEC; docs/branched.md)."""

    kind: Literal["branched"] = field(fix="must be 'branched' for bcrit branch")
    name: str = field(fix="must be a non-empty string without '/'")
    workload: str = field("dit", fix="must be dit, quadratic or module:attr")
    reference: Reference
    branches: Branches
    analysis: Analysis | None = None
    fixed: dict[str, Any] | None = field(None, fix="must be a mapping of trial-config keys to values")
    stopping: BranchStopping | None = None
    tracking: Tracking | None = None
    storage: str | None = field(None, fix="must be a directory path")
