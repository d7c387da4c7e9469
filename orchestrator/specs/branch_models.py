"""The branched study's typed model (``BranchModel``: its sections, their keys, types and ranges), the source of the
published JSON Schema (``bcrit schema branch``, docs/schema/branch.schema.json); the rules between keys (a
multiplier that makes an integer batch size, examples a multiple of evals x k x B0, the keys the study sets) are its
validators. The kept checkpoints are checked on disk by orchestrator.specs.branch_spec."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from analysis.core.lr_rules import LR_RULES
from analysis.features.branched.branched import COMPARE
from orchestrator.specs.models import SpecModel, field, rule
from orchestrator.specs.sweep_models import SPLIT_KEYS, Name, PosInt, Split, SplitKeys, Tracking, WorkloadName
from trainables.workloads import get_workload

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Tolerance = Annotated[float, Field(ge=0, allow_inf_nan=False)]
NonNegInt = Annotated[int, Field(ge=0)]
SCALE_BY = ("micro_batch_size", "grad_accum", "num_workers")
# set by the study for every trial (a clear error instead of a silent conflict)
OWNED = ("batch_size", *SPLIT_KEYS, "lr", "seed", "max_steps", "target_loss", "checkpoint_every", "init_from",
         "keep_dir", "keep_steps", "use_gpu", "cpus_per_worker", "divergence_factor")  # fmt: skip
# and the workload's noise_key (trainables.workloads.Workload)


def _sorted_distinct(v: Any, where: str) -> list[int]:
    """A list of distinct integers (one: a list of it), sorted."""
    v = [v] if isinstance(v, int) else v
    if len(set(v)) != len(v):
        raise rule(f"{where} has duplicates {v}; list each once")
    return sorted(v)


class Reference(SpecModel):
    """The reference run the branches start from: its batch size B0, learning rate, seed and split."""

    batch_size: PosInt = field(fix="must be an integer >= 1")
    lr: Positive = field(fix="must be a positive number")
    seed: NonNegInt = field(0, fix="must be an integer >= 0")
    split: SplitKeys = field(SplitKeys(), fix="how B0 is reached")
    checkpoints: str | None = field(None, fix="must be a directory of kept checkpoints (step<N>/ inside)")
    use_gpu: bool = field(False, fix="must be true or false")
    cpus_per_worker: PosInt = field(1, fix="must be an integer >= 1")
    _split: Split = PrivateAttr()

    @model_validator(mode="after")
    def _split_reaches_b0(self) -> Reference:
        self._split = self.split.split(self.batch_size, "reference.split")
        return self


class Branches(SpecModel):
    """Where the branches start, their batch sizes k x B0 and how far they train."""

    points: PosInt | Annotated[list[PosInt], Field(min_length=1)] = field(
        fix="must be a non-empty list of integers >= 1 (the reference's steps the branches start from)"
    )
    multipliers: Annotated[list[Positive], Field(min_length=1)] = field(
        fix="must be a non-empty list of numbers > 0, e.g. [2, 4, 8] (the multipliers k of B0; 1 is added)"
    )
    lr_rule: Literal[LR_RULES] | None = field(
        None, fix=f"must be one of {list(LR_RULES)} (how a branch's lr scales with k; default: the workload's)"
    )
    examples: PosInt = field(fix="must be an integer >= 1")
    evals: PosInt = field(4, fix="must be an integer >= 1")
    seeds: NonNegInt | Annotated[list[NonNegInt], Field(min_length=1)] = field(
        [0], fix="must be an integer >= 0 or a non-empty list of them (the branches' seeds)"
    )
    scale_by: Literal[SCALE_BY] = field("micro_batch_size", fix=f"must be one of {list(SCALE_BY)}")

    @field_validator("points", "seeds")
    @classmethod
    def _distinct(cls, v: Any, info: ValidationInfo) -> list[int]:
        return _sorted_distinct(v, f"branches.{info.field_name}")

    def ks(self) -> tuple[float, ...]:
        """The multipliers, ascending, 1 (the comparator) included."""
        return tuple(sorted({1.0, *(float(k) for k in self.multipliers)}))


class Analysis(SpecModel):
    """How the branches are compared."""

    epsilons: Tolerance | Annotated[list[Tolerance], Field(min_length=1)] = field(
        [0.01, 0.02, 0.05], fix="must be a non-empty list of tolerances >= 0, e.g. [0.01, 0.02, 0.05]"
    )
    compare: Literal[COMPARE] = field("reference", fix=f"must be one of {list(COMPARE)}")
    window: Annotated[float, Field(ge=0, lt=1)] = field(
        0.0, fix="must be in [0, 1) (the smoothing window, a fraction of branches.examples)"
    )

    def tolerances(self) -> tuple[float, ...]:
        return tuple(float(e) for e in (self.epsilons if isinstance(self.epsilons, list) else [self.epsilons]))


class BranchStopping(SpecModel):
    """When a branch diverges."""

    divergence_factor: Positive | None = field(
        None, fix="must be a positive number (stop when the loss exceeds this x its start)"
    )


class BranchModel(SpecModel):
    """A branched study (bcrit branch SPEC; docs/branched.md)."""

    kind: Literal["branched"] = field(fix="must be 'branched' for bcrit branch (a sweep spec goes to bcrit sweep)")
    name: Name = field(fix="must be a non-empty string without '/'")
    workload: WorkloadName = field("dit", fix="must be dit, quadratic or module:attr")
    reference: Reference
    branches: Branches
    analysis: Analysis = Analysis()
    fixed: dict[str, Any] | None = field(None, fix="must be a mapping of trial-config keys to values")
    stopping: BranchStopping = BranchStopping()
    tracking: Tracking = Tracking()
    storage: str | None = field(None, fix="must be a directory path")

    @model_validator(mode="after")
    def _sections_agree(self) -> BranchModel:
        """The keys the study sets, and the branches' batch sizes k x B0 against their examples and scale_by."""
        noise = get_workload(self.workload).noise_key
        fixed = self.fixed or {}
        if owned := [k for k in (*OWNED, *([noise] if noise else [])) if k in fixed]:
            raise rule(f"fixed.{owned[0]} is set by the branched study (reference/branches sections); remove it")
        if "seeds" in fixed:
            raise rule("fixed.seeds: a branched study takes reference.seed and branches.seeds; remove it")
        br, b0 = self.branches, self.reference.batch_size
        for k in br.ks():
            if abs(k * b0 - round(k * b0)) > 1e-9:
                raise rule(f"branches.multipliers: k={k:g} x B0 {b0} is not an integer batch size")
            if br.scale_by != "micro_batch_size" and abs(k - round(k)) > 1e-9:
                raise rule(f"branches.multipliers: k={k:g} must be an integer with scale_by: {br.scale_by}")
        for k in br.ks():
            b = round(k * b0)
            if br.examples % b or (br.examples // b) % br.evals:
                raise rule(
                    f"branches.examples {br.examples} must be a multiple of evals x k x B0 = {br.evals} x {b} for "
                    f"k={k:g} (every branch evaluates at the same example counts); change examples, evals or "
                    "multipliers"
                )
        return self
