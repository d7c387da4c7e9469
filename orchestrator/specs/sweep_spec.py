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

from orchestrator.errors import UserError
from orchestrator.specs.adaptive_spec import Adaptive
from orchestrator.specs.models import validate
from orchestrator.specs.sweep_models import OWNED as OWNED
from orchestrator.specs.sweep_models import PER_BATCH_SIZE_FIXED, PER_BATCH_SIZE_STOPPING, Split, SweepModel
from orchestrator.specs.yaml_overrides import apply_overrides, dump_yaml, load_yaml
from orchestrator.storage.layout import MLFLOW_DB, SweepLayout
from orchestrator.storage.uri import is_uri, local_dir

STOP_BEHIND_DEFAULT = True  # pinned in the saved spec (_saved)


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

    @property
    def stops_behind(self) -> bool:
        """Whether trials behind their batch size's best are stopped: ``stopping.behind`` where the trials have a
        target to reach."""
        return self.stop_behind and self.stopping.get("target_loss") is not None

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
        if self.search == "optuna":  # one study per group (batch size x split x seed)
            return len(self.groups()) * self.trials_per_batch_size
        space = len(self.trial_configs())
        budget = self.adaptive.budget_trials if self.search == "adaptive" else None
        return space if budget is None else min(space, budget)

    def to_yaml(self) -> str:
        return dump_yaml(self.raw)


# --- parsing ----------------------------------------------------------------------------------------------------
def load_spec(path: str, overrides: list[str] | None = None, *, sweep_dir: str | None = None) -> SweepSpec:
    """Read, override (``--set key=value``) and validate a sweep spec. Raises UserError."""
    return parse_spec(apply_overrides(load_yaml(path), overrides or []), sweep_dir=sweep_dir, source=path)


def parse_spec(data: dict, *, sweep_dir: str | None = None, source: str = "spec") -> SweepSpec:
    """The spec of ``data`` (the YAML read; ``source``: its file) validated by `SweepModel`, every mistake one
    UserError line; its defaults resolved (storage, tracking, ``stopping.behind``)."""
    if isinstance(data, dict) and data.get("kind") == "branched":  # orchestrator.features.branched.branch_study
        raise UserError(f"{source} is a branched study (kind: branched); run it with bcrit branch {source}")
    m = validate(SweepModel, data, "", scoped=True, source=source, example="tiny")
    sci, nui, track, stop = m.scientific, m.nuisance, m.tracking, m.stopping
    storage_uri, sweep_dir = _storage(m.storage, m.name, sweep_dir)
    uri = track.mlflow_uri
    uri = (os.environ.get("MLFLOW_TRACKING_URI") or local_mlflow_uri(sweep_dir)) if uri is None else uri
    experiment = "bcrit" if track.experiment is None else track.experiment
    behind = stop.behind if "behind" in stop.model_fields_set else STOP_BEHIND_DEFAULT
    tracking = {"mlflow_uri": uri, "experiment": experiment}
    return SweepSpec(
        name=m.name,
        workload=m.workload,
        batch_sizes=tuple(sci.batch_sizes),
        splits=sci._splits,
        use_gpu=sci.use_gpu,
        cpus_per_worker=sci.cpus_per_worker,
        gpus_per_worker=float(sci.gpus_per_worker),
        search=nui.search,
        nuisance=nui.values(),
        trials_per_batch_size=nui.trials_per_batch_size if nui.search == "optuna" else 0,
        search_seed=nui.seed,
        fixed=m._fixed,
        seeds=m._seeds,
        stopping=m._stopping,
        stop_behind=behind,
        mlflow_uri=uri,
        experiment=experiment,
        sweep_dir=sweep_dir,
        raw=_saved(data, m.name, storage_uri or sweep_dir, tracking, behind, m._adaptive),
        samplers=sci.samplers(),
        storage_uri=storage_uri,
        adaptive=m._adaptive,
    )


def _saved(data: dict, name: str, storage: str, tracking: dict, behind: bool, adaptive: Adaptive | None) -> dict:
    """The spec as the sweep saves it (``spec.yaml`` in its directory, an artifact of its MLflow parent run): the YAML
    as given, with what it left to a default that decides how the sweep runs pinned to the value this bcrit used --
    the storage, the tracking URI and experiment, ``stopping.behind``, and an adaptive goal's ``bins``, ``min_seeds``,
    ``running`` and ``hold``. A sweep resumed from its directory then keeps the choices it started with after a
    later bcrit changes a default, and a YAML resumed against it must agree with them
    (orchestrator.specs.resume_rules.spec_to_run). A spec saved before a key was pinned reads it with the current
    default."""
    raw = {**data, "name": name, "storage": storage, "tracking": tracking}
    raw["stopping"] = {**(data.get("stopping") or {}), "behind": behind}
    if adaptive is not None:
        goal = {**data["nuisance"]["goal"], "bins": adaptive.bins, "min_seeds": adaptive.min_seeds}
        goal |= {"running": "end" if adaptive.end_running else "wait", "hold": adaptive.hold}
        raw["nuisance"] = {**data["nuisance"], "goal": goal}
    return raw


def _storage(storage: str | None, name: str, sweep_dir: str | None) -> tuple[str | None, str]:
    """``(storage URI or None, the sweep's local directory)`` of the spec's ``storage`` (default runs/<name>): a URI's
    local directory is orchestrator.storage.uri.local_dir (unless ``sweep_dir`` says where it is)."""
    storage = os.path.join("runs", name) if storage is None else storage
    storage_uri = storage.strip() if is_uri(storage) else None  # checked (opened, probed) before launch
    return storage_uri, os.path.abspath(sweep_dir or (local_dir(storage_uri) if storage_uri else storage))


def local_mlflow_uri(sweep_dir: str) -> str:
    """The embedded default tracking store: SQLite in the sweep dir, written only by the sweep driver."""
    return f"sqlite:///{os.path.join(os.path.abspath(sweep_dir), MLFLOW_DB)}"
