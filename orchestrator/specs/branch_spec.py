"""The branched-study spec (Merrill et al. 2025; analysis.features.branched), validated before anything runs; the trial
configs of its reference and branches. Run by orchestrator.features.branched.branch_study (``bcrit branch SPEC.yaml``).

``kind: branched`` marks the spec (``bcrit sweep`` refuses it and points here). ``reference``: the trial branched
from (``batch_size`` = B0, ``lr``, ``seed``, optional ``split``; or ``checkpoints``: an earlier study's
``reference_checkpoints/``). ``branches``: ``points`` (reference steps, multiples of its eval/report cadence),
``multipliers`` k (1, the comparator, is always added), ``lr_rule`` (``sqrt``: Adam, the dit default; ``linear``:
SGD, the quadratic default; ``constant``), ``examples`` Δ (divisible by every k x B0), ``evals`` per branch (at the
same example counts for every k), ``seeds``, ``scale_by`` (``micro_batch_size``, ``grad_accum`` or ``num_workers``:
how k x B0 is reached). ``analysis`` (``epsilons``, ``compare``, ``window``), ``fixed``, ``stopping``, ``tracking``,
``storage`` as in a sweep spec. Every key: docs/branched.md; examples: examples/branched-quadratic.yaml,
examples/branched-tiny.yaml.

Every mistake raises one `UserError` line naming the key and the fix."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from analysis.core.lr_rules import LR_RULES, lr_factor
from orchestrator.errors import UserError
from orchestrator.records.tracking_uri import check_tracking
from orchestrator.specs.branch_models import Analysis, Branches, BranchModel, BranchStopping, Reference
from orchestrator.specs.sweep_models import Tracking
from orchestrator.specs.sweep_spec import (
    SPLIT_KEYS,
    Split,
    _keys,
    _pos_int,
    _resolve_split,
    _section,
    local_mlflow_uri,
    name_and_workload,
)
from orchestrator.specs.yaml_overrides import apply_overrides, dump_yaml, load_yaml
from orchestrator.storage.shared_dir import check_storage, check_storage_value
from trainables.branch_points import kept_path
from trainables.config import ConfigError
from trainables.workloads import get_workload

KIND = "branched"
TOP_KEYS = tuple(BranchModel.model_fields)
REFERENCE_KEYS = tuple(Reference.model_fields)
BRANCH_KEYS = tuple(Branches.model_fields)
ANALYSIS_KEYS = tuple(Analysis.model_fields)
STOPPING_KEYS = tuple(BranchStopping.model_fields)
# set by the study for every trial (a clear error instead of a silent conflict)
OWNED = (
    "batch_size",
    *SPLIT_KEYS,
    "lr",
    "seed",
    "max_steps",
    "target_loss",
    "checkpoint_every",
    "init_from",
    "keep_dir",
    "keep_steps",
    "use_gpu",
    "cpus_per_worker",
    "divergence_factor",
)  # and the workload's noise_key (trainables.workloads.Workload)
STUDY_FILE = "branched_spec.yaml"  # the resolved spec in the study dir (what --resume reads)
KEEP_DIR = "reference_checkpoints"
REFERENCE_ID = "reference_trial.txt"  # the reference's Tune trial id, once it has finished


@dataclass(frozen=True)
class BranchSpec:
    name: str
    workload: str
    b0: int
    ref_split: Split
    lr0: float
    ref_seed: int
    checkpoints: str | None  # existing kept checkpoints instead of training the reference
    use_gpu: bool
    cpus_per_worker: int
    points: tuple[int, ...]
    multipliers: tuple[float, ...]  # ascending, includes 1
    lr_rule: str
    delta: int
    evals: int
    seeds: tuple[int, ...]
    scale_by: str
    epsilons: tuple[float, ...]
    compare: str
    window: float
    fixed: dict[str, Any]
    divergence_factor: float | None
    mlflow_uri: str
    experiment: str
    sweep_dir: str
    raw: dict = field(compare=False, repr=False)

    storage_uri = None  # a branched study's storage is a directory (a URI is refused when the spec is read)

    @property
    def storage_root(self) -> str:
        """Where Ray Tune and Ray Train write: the study directory (a branched study refuses URI storage)."""
        return self.sweep_dir

    @property
    def keep_dir(self) -> str:
        return self.checkpoints or os.path.join(self.sweep_dir, KEEP_DIR)

    def to_yaml(self) -> str:
        return dump_yaml(self.raw)

    # --- trial configs -----------------------------------------------------------------------------------
    def _common(self) -> dict[str, Any]:
        out = {**self.fixed, "use_gpu": self.use_gpu, "cpus_per_worker": self.cpus_per_worker}
        key = get_workload(self.workload).noise_key  # common random numbers across batch sizes (the NQM's)
        if key:
            out[key] = self.b0
        if self.divergence_factor is not None:
            out["divergence_factor"] = self.divergence_factor
        return out

    def reference_config(self) -> dict[str, Any]:
        """The reference trial: trained to the last branch point, checkpoints kept at every point."""
        every = reduce(math.gcd, self.points)
        return {
            **self._common(),
            "batch_size": self.b0,
            **self.ref_split.config(),
            "lr": self.lr0,
            "seed": self.ref_seed,
            "max_steps": max(self.points),
            "checkpoint_every": every,
            "keep_dir": self.keep_dir,
            "keep_steps": list(self.points),
        }

    def branch_split(self, k: float) -> Split:
        s, b = self.ref_split, round(k * self.b0)
        if self.scale_by == "micro_batch_size":
            return Split(b // (s.grad_accum * max(1, s.num_workers)), s.grad_accum, s.num_workers)
        if self.scale_by == "grad_accum":
            return Split(s.micro_batch_size, s.grad_accum * round(k), s.num_workers)
        return Split(s.micro_batch_size, s.grad_accum, max(1, s.num_workers) * round(k))

    def branch_config(self, point: int, k: float, seed: int, parent_trial_id: str) -> dict[str, Any]:
        b = round(k * self.b0)
        steps = self.delta // b
        every = steps // self.evals
        cfg = {
            **self._common(),
            "batch_size": b,
            **self.branch_split(k).config(),
            "lr": self.lr0 * lr_factor(self.lr_rule, k),
            "seed": seed,
            "max_steps": steps,
            "eval_every": every,
            "report_every": every,
            "checkpoint_every": every * max(1, self.evals // 4),
            "init_from": branch_checkpoint(self.keep_dir, point),
            "extra": {**self.fixed.get("extra", {}), "parent_trial_id": parent_trial_id, "branch_step": point, "k": k},
        }
        return {**cfg, **get_workload(self.workload).branch_keys}  # the DiT: no warm-up (the reference's is behind it)

    def branches(self) -> list[tuple[int, float, int]]:
        return [(p, k, s) for p in self.points for k in self.multipliers for s in self.seeds]

    def branch_configs(self, parent_trial_id: str) -> list[dict[str, Any]]:
        return [self.branch_config(p, k, s, parent_trial_id) for p, k, s in self.branches()]


def branch_checkpoint(keep_dir: str, point: int) -> str:
    return kept_path(keep_dir, point)


# --- parsing ----------------------------------------------------------------------------------------------------
def load_branch_spec(path: str, overrides: list[str] | None = None, *, sweep_dir: str | None = None) -> BranchSpec:
    return parse_branch_spec(apply_overrides(load_yaml(path), overrides or []), sweep_dir=sweep_dir, source=path)


def _number(v: Any, where: str, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise UserError(f"{where} must be a {'positive ' if positive else ''}number, got {v!r}")
    return float(v)


def _int_list(v: Any, where: str, minimum: int) -> list[int]:
    v = [v] if isinstance(v, int) and not isinstance(v, bool) else v
    if not isinstance(v, list) or not v:
        raise UserError(f"{where} must be a non-empty list of integers")
    out = [_pos_int(x, f"{where}[]", minimum=minimum) for x in v]
    if len(set(out)) != len(out):
        raise UserError(f"{where} has duplicates {out}; list each once")
    return sorted(out)


def parse_branch_spec(data: dict, *, sweep_dir: str | None = None, source: str = "spec") -> BranchSpec:
    """Validate a branched-study spec; every mistake raises one UserError line naming the key and the fix. The
    sections are read in this order (the first mistake is the one named): top level, reference, branches,
    analysis, stopping, where it is stored and tracked, the reference's checkpoints, its resources."""
    _keys(data, TOP_KEYS, "")
    if data.get("kind") != KIND:
        raise UserError(f"{source}: kind must be {KIND!r} for bcrit branch (a sweep spec goes to bcrit sweep)")
    name, workload = name_and_workload(data, source, example="branched-tiny")
    w = get_workload(workload)
    ref = _section(data, "reference", Reference, required=True)
    br = _section(data, "branches", Branches, required=True)
    an = _section(data, "analysis", Analysis)
    fixed = dict(_section(data, "fixed", None))
    stop = _section(data, "stopping", BranchStopping)
    track = _section(data, "tracking", Tracking)
    for key in (*OWNED, *([w.noise_key] if w.noise_key else [])):
        if key in fixed:
            raise UserError(f"fixed.{key} is set by the branched study (reference/branches sections); remove it")
    if "seeds" in fixed:
        raise UserError("fixed.seeds: a branched study takes reference.seed and branches.seeds; remove it")
    reference = _parse_reference(ref)
    branches = _parse_branches(br, reference["b0"], w.lr_rule)
    analysis = _parse_analysis(an)
    div = stop.get("divergence_factor")
    div = None if div is None else _number(div, "stopping.divergence_factor")
    name = name.strip()
    where = _parse_where(data, track, name, sweep_dir)
    checkpoints = _check_checkpoints(reference.pop("checkpoints"), branches["points"], w.check_kept)
    return BranchSpec(
        name=name,
        workload=workload,
        **reference,
        checkpoints=checkpoints,
        use_gpu=ref.get("use_gpu", False),
        cpus_per_worker=ref.get("cpus_per_worker", 1),
        **branches,
        **analysis,
        fixed=fixed,
        divergence_factor=div,
        **where,
        raw={
            **data,
            "name": name,
            "storage": where["sweep_dir"],
            "tracking": {"mlflow_uri": where["mlflow_uri"], "experiment": where["experiment"]},
        },
    )


def _parse_reference(ref: dict) -> dict[str, Any]:
    """The ``reference`` section: B0, its learning rate, seed and split, and a directory of kept checkpoints."""
    b0, lr0, ref_seed, checkpoints = ref["batch_size"], float(ref["lr"]), ref.get("seed", 0), ref.get("checkpoints")
    ref_split = _resolve_split(b0, ref.get("split", {"grad_accum": 1, "num_workers": 0}), "reference.split")
    return {"b0": b0, "lr0": lr0, "ref_seed": ref_seed, "ref_split": ref_split, "checkpoints": checkpoints}


def _parse_branches(br: dict, b0: int, default_lr_rule: str) -> dict[str, Any]:
    """The ``branches`` section: points, multipliers k (1 added), how k x B0 is reached, the lr rule (default: the
    workload's, `trainables.workloads.Workload.lr_rule`), the examples each branch trains and its evaluations (the
    same example counts for every k), seeds."""
    points = _int_list(br.get("points"), "branches.points", minimum=1)
    raw_k = br.get("multipliers")
    if not isinstance(raw_k, list) or not raw_k:
        raise UserError("branches.multipliers must be a non-empty list of numbers > 0, e.g. [2, 4, 8]")
    ks = sorted({1.0, *(_number(k, "branches.multipliers[]") for k in raw_k)})
    scale_by = br.get("scale_by", "micro_batch_size")
    for k in ks:
        if abs(k * b0 - round(k * b0)) > 1e-9:
            raise UserError(f"branches.multipliers: k={k:g} x B0 {b0} is not an integer batch size")
        if scale_by != "micro_batch_size" and abs(k - round(k)) > 1e-9:
            raise UserError(f"branches.multipliers: k={k:g} must be an integer with scale_by: {scale_by}")
    lr_rule = br.get("lr_rule", default_lr_rule)
    if lr_rule not in LR_RULES:
        raise UserError(f"branches.lr_rule must be one of {list(LR_RULES)}, got {lr_rule!r}")
    delta, evals = br["examples"], br.get("evals", 4)
    for k in ks:
        b = round(k * b0)
        if delta % b or (delta // b) % evals:
            raise UserError(
                f"branches.examples {delta} must be a multiple of evals x k x B0 = {evals} x {b} for k={k:g} "
                "(every branch evaluates at the same example counts); change examples, evals or multipliers"
            )
    seeds = _int_list(br.get("seeds", [0]), "branches.seeds", minimum=0)
    return {
        "points": tuple(points),
        "multipliers": tuple(ks),
        "lr_rule": lr_rule,
        "delta": delta,
        "evals": evals,
        "seeds": tuple(seeds),
        "scale_by": scale_by,
    }


def _parse_analysis(an: dict) -> dict[str, Any]:
    """The ``analysis`` section: the loss tolerances epsilon, what a branch is compared with, the smoothing window."""
    eps = an.get("epsilons", [0.01, 0.02, 0.05])
    eps = [eps] if isinstance(eps, (int, float)) and not isinstance(eps, bool) else eps
    if not isinstance(eps, list) or not eps:
        raise UserError("analysis.epsilons must be a non-empty list of tolerances >= 0, e.g. [0.01, 0.02, 0.05]")
    eps = [_number(e, "analysis.epsilons[]", positive=False) for e in eps]
    if any(e < 0 for e in eps):
        raise UserError(f"analysis.epsilons must be >= 0, got {eps}")
    compare = an.get("compare", "reference")
    window = _number(an.get("window", 0.0), "analysis.window", positive=False)
    if not 0 <= window < 1:
        raise UserError(f"analysis.window must be in [0, 1) (a fraction of branches.examples), got {window}")
    return {"epsilons": tuple(eps), "compare": compare, "window": window}


def _parse_where(data: dict, track: dict, name: str, sweep_dir: str | None) -> dict[str, str]:
    """Where the study is stored (``storage``, default runs/<name>) and tracked (MLflow URI and experiment)."""
    storage = data.get("storage") or os.path.join("runs", name)
    if not isinstance(storage, str):
        raise UserError("storage must be a directory path, e.g. storage: ./runs/branched-tiny")
    check_storage_value(storage)
    sweep_dir = os.path.abspath(sweep_dir or storage)
    uri = track.get("mlflow_uri") or os.environ.get("MLFLOW_TRACKING_URI") or local_mlflow_uri(sweep_dir)
    experiment = track.get("experiment") or "bcrit"
    if not isinstance(experiment, str):
        raise UserError("tracking.experiment must be a string (an MLflow experiment name)")
    return {"mlflow_uri": uri, "experiment": experiment, "sweep_dir": sweep_dir}


def _check_checkpoints(checkpoints: str | None, points: tuple[int, ...], check_kept) -> str | None:
    """``reference.checkpoints`` as an absolute path holding a checkpoint at every branch point (None: none), each
    passing the workload's ``check_kept``."""
    if checkpoints is None:
        return None
    checkpoints = os.path.abspath(checkpoints)
    missing = [p for p in points if not os.path.isdir(branch_checkpoint(checkpoints, p))]
    if missing:
        raise UserError(
            f"reference.checkpoints {checkpoints!r} has no checkpoint for branch point(s) {missing}; "
            "branch only from kept steps"
        )
    for p in points if check_kept else ():
        try:
            check_kept(branch_checkpoint(checkpoints, p))
        except ConfigError as e:
            raise UserError(f"reference.checkpoints: {e}") from None
    return checkpoints


# --- validation of the trial configs (before anything runs) ------------------------------------------------------
def check_branch_spec(spec: BranchSpec, resources: dict | None = None) -> tuple[dict, list[dict]]:
    """Every trial config through its config class and the workload's check; the reference's cadence against the
    branch points. Returns (reference config, branch configs with a placeholder parent). Raises UserError."""
    check_storage(spec.sweep_dir)
    check_tracking(spec.mlflow_uri)
    w = get_workload(spec.workload)
    if resources is None:  # the embedded local Ray that run_study starts (a cluster's: pass its resources)
        # torch: deferred, the dry run (bcrit sweep --dry-run) loads this module
        import torch

        resources = {"CPU": float(2 * (os.cpu_count() or 1)), "GPU": float(torch.cuda.device_count())}
    defaults = {f.name: f.default for f in dataclasses.fields(w.config_cls)}
    every = spec.fixed.get("report_every") or spec.fixed.get("eval_every", defaults["eval_every"])
    bad = [p for p in spec.points if not isinstance(every, int) or p % every]
    if bad:
        raise UserError(
            f"branches.points {bad} are not multiples of the reference's report cadence {every} "
            "(fixed.eval_every / report_every); pick points on it"
        )
    try:
        ref = w.config_cls.from_dict(spec.reference_config())
    except (ConfigError, TypeError) as e:
        raise UserError(f"reference: {e}") from None
    if spec.checkpoints is None:
        try:
            w.check(ref, resources)
        except ConfigError as e:
            raise UserError(f"reference: {e}") from None
    out, checked = [], set()
    for p, k, s in spec.branches():
        try:
            cfg = w.config_cls.from_dict(spec.branch_config(p, k, s, "?"))
            if k not in checked:
                w.check(cfg, resources)
                checked.add(k)
        except (ConfigError, TypeError) as e:
            raise UserError(f"branch k={k:g} at step {p}: {e}") from None
        out.append(cfg.to_dict())
    return ref.to_dict(), out
