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

from analysis.core.lr_rules import lr_factor
from orchestrator.errors import UserError
from orchestrator.records.tracking_uri import check_tracking
from orchestrator.specs.branch_models import BranchModel
from orchestrator.specs.models import validate
from orchestrator.specs.sweep_models import Split
from orchestrator.specs.sweep_spec import local_mlflow_uri
from orchestrator.specs.yaml_overrides import apply_overrides, dump_yaml, load_yaml
from orchestrator.storage.shared_dir import check_storage, check_storage_value
from trainables.branch_points import kept_path
from trainables.config import ConfigError
from trainables.workloads import get_workload

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
    stops_behind = False  # its branches are all measured to the end
    search = "grid"  # its trials are the grid it names

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
def load_branch_spec(path: str, overrides: list[str] | None = None) -> BranchSpec:
    return parse_branch_spec(apply_overrides(load_yaml(path), overrides or []), source=path)


def parse_branch_spec(data: dict, *, sweep_dir: str | None = None, source: str = "spec") -> BranchSpec:
    """Validate a branched-study spec (`BranchModel`); every mistake raises one UserError line naming the key and
    the fix. Then where it is stored and tracked, and the reference's kept checkpoints."""
    m = validate(BranchModel, data, "", scoped=True, source=source, example="branched-tiny")
    ref, br, an, track = m.reference, m.branches, m.analysis, m.tracking
    storage = m.storage or os.path.join("runs", m.name)
    check_storage_value(storage)
    sweep_dir = os.path.abspath(sweep_dir or storage)
    uri = track.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or local_mlflow_uri(sweep_dir)
    experiment = track.experiment or "bcrit"
    w = get_workload(m.workload)
    return BranchSpec(
        name=m.name,
        workload=m.workload,
        b0=ref.batch_size,
        ref_split=ref._split,
        lr0=float(ref.lr),
        ref_seed=ref.seed,
        checkpoints=_check_checkpoints(ref.checkpoints, tuple(br.points), w.check_kept),
        use_gpu=ref.use_gpu,
        cpus_per_worker=ref.cpus_per_worker,
        points=tuple(br.points),
        multipliers=br.ks(),
        lr_rule=br.lr_rule or w.lr_rule,
        delta=br.examples,
        evals=br.evals,
        seeds=tuple(br.seeds),
        scale_by=br.scale_by,
        epsilons=an.tolerances(),
        compare=an.compare,
        window=float(an.window),
        fixed=dict(m.fixed or {}),
        divergence_factor=None if m.stopping.divergence_factor is None else float(m.stopping.divergence_factor),
        mlflow_uri=uri,
        experiment=experiment,
        sweep_dir=sweep_dir,
        raw={**data, "name": m.name, "storage": sweep_dir, "tracking": {"mlflow_uri": uri, "experiment": experiment}},
    )


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
