"""The trial's configuration: one frozen, validated dataclass. Everything that changes a result lives here,
and all of it is logged (MLflow params, checkpoint, summary)."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from analysis.core.allocation import SAMPLERS
from analysis.core.bcrit_error import BcritError
from analysis.core.gns import DEFAULT_WINDOW
from analysis.core.lr_rules import LR_RULES
from analysis.core.stages import BatchStages
from trainables.presets import PRESETS

RETIRED_KEYS = ("gns_ema_beta",)  # keys older checkpoints may hold (gns_ema_beta: replaced by gns_window)


class ConfigError(BcritError):
    """A user mistake in a trial configuration; the message is one line that names the problem and the fix."""


@dataclass(frozen=True)
class BaseConfig:
    """The fields every workload's trial config shares: the batch size and its split, the learning rate and seed,
    the step budget and stop rules, the evaluation / report / checkpoint cadence (what the skeleton reads,
    `trainables.skeleton.ScheduleConfig`), the branched study's keys, the resources, and free-form tags. A workload's
    config subclasses it (re-declaring a field only to change its default) and extends `validate`."""

    # --- the scientific variable and how it is split ------------------------------------------------------
    batch_size: int = 32  # effective B = micro_batch_size * grad_accum * num_workers
    micro_batch_size: int = 32  # examples per forward/backward on one worker
    num_workers: int = 0  # W data-parallel ranks; 0 = run in-process (no worker actors), counts as 1
    grad_accum: int | None = None  # A; None = derived from the three above (of batch_size: stage 0)
    batch_schedule: list = field(default_factory=list)  # [[step, B], ...]: from `step` steps done on, batch B, by
    # accumulation (micro and W fixed); [] = batch_size throughout (analysis.core.stages, docs/schedule.md)
    schedule_lr_rule: str = "sqrt"  # a later stage's lr = lr x sqrt(B / batch_size) (Adam); linear | constant
    lr: float = 1e-3  # peak learning rate
    seed: int = 0
    # --- budget and stopping (decided inside the loop: REFERENCE.md, placement-group leak) ---------------
    max_steps: int = 200  # step budget
    target_loss: float | None = None  # stop once eval/loss <= this
    divergence_factor: float = 3.0  # diverged once eval/loss > factor * first eval/loss (or any non-finite loss)
    eval_every: int = 10  # steps between held-out evaluations
    # --- reporting and checkpoints ------------------------------------------------------------------------
    report_every: int = 0  # steps between reports to Ray; 0 = eval_every
    checkpoint_every: int = 0  # steps between checkpoints (a multiple of report_every); 0 = only at the end
    # --- branched study (trainables.branch_points) -------------------------------------------------------------
    init_from: str | None = None  # start from this checkpoint (weights, optimizer state; counters reset)
    keep_dir: str | None = None  # copy the checkpoints at keep_steps to <keep_dir>/step<N> (branch points)
    keep_steps: list = field(default_factory=list)  # steps whose checkpoints are kept (multiples of checkpoint_every)
    # --- resources ----------------------------------------------------------------------------------------
    use_gpu: bool = False  # a GPU per worker (or per in-process trial)
    cpus_per_worker: int = 1
    gpus_per_worker: float = 1.0  # the share of one GPU each worker holds: 0.25 packs four on one GPU (use_gpu)
    extra: dict = field(default_factory=dict, compare=False, repr=False)  # free-form tags (not used by training)

    BOUNDS: ClassVar[dict[str, Bound]]  # every field's row (a subclass: BASE_BOUNDS plus its own fields)
    WHAT: ClassVar[str] = "config"  # how its errors name it ("unknown <WHAT> key ...")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """One ConfigError for the first impossible shared setting: each field against its row of ``BOUNDS``, the
        split, the batch schedule, the checkpoint cadence. A subclass adds its own checks after these."""
        check_bounds(self, type(self).BOUNDS)
        per_step = self.micro_batch_size * self.world_size
        if self.batch_size % per_step:
            raise ConfigError(
                f"batch_size {self.batch_size} is not divisible by micro_batch_size x workers = {per_step}; "
                f"pick a batch size that is a multiple of {per_step}"
            )
        if self.grad_accum is not None and self.grad_accum != self.accum:
            raise ConfigError(
                f"batch_size {self.batch_size} != micro_batch_size {self.micro_batch_size} x grad_accum "
                f"{self.grad_accum} x workers {self.world_size}; fix one of them (or drop grad_accum to derive it)"
            )
        check_schedule(self)
        check_gpu_share(self)
        if self.checkpoint_every and self.checkpoint_every % self.report_interval:
            raise ConfigError(
                f"checkpoint_every {self.checkpoint_every} must be a multiple of report_every {self.report_interval}"
            )

    @property
    def world_size(self) -> int:
        return max(1, self.num_workers)

    @property
    def accum(self) -> int:
        return self.batch_size // (self.micro_batch_size * self.world_size)

    @property
    def report_interval(self) -> int:
        return self.report_every or self.eval_every

    @functools.cached_property
    def stages(self) -> BatchStages:
        """The batch-size stages (`analysis.core.stages`): one stage at ``batch_size`` without a ``batch_schedule``."""
        return BatchStages.from_schedule(self.batch_size, self.batch_schedule, self.micro_batch_size * self.world_size)

    def to_dict(self) -> dict[str, Any]:
        """What travels to the workers and is logged (MLflow params, checkpoints): every field, ``grad_accum``
        resolved."""
        return {**dataclasses.asdict(self), "grad_accum": self.accum}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        return config_from_dict(cls, data, cls.WHAT)


@dataclass(frozen=True)
class TrialConfig(BaseConfig):
    """The DiT trial (`trainables.loop`): the shared fields of `BaseConfig` and the model's, data's, optimiser's,
    evaluation's, GNS's and timestep sampler's own."""

    # --- model and data --------------------------------------------------------------------------------
    preset: str = "tiny"  # key of trainables.presets.PRESETS
    dataset: str = "digits"  # "digits" (ships with the package), a packed latent store or a fast-DiT latent folder
    eval_size: int = 297  # held-out examples (digits: the last 297 of a seeded shuffle; latents: last files)
    # --- optimisation (nuisance hyper-parameters; lr in BaseConfig: the AdamW peak learning rate) -----------
    warmup_steps: int = 0  # linear warm-up, then constant
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    grad_clip: float = 0.0  # max global grad norm; 0 = no clipping
    ema_decay: float = 0.0  # EMA of weights (diffusers EMAModel); 0 = off
    class_dropout: float = 0.1  # classifier-free guidance label dropout probability
    # --- evaluation for steps-to-target ------------------------------------------------------------------
    eval_repeats: int = 2  # fixed noise draws per held-out example (more = lower-noise eval loss)
    eval_ema: bool = False  # evaluate the EMA weights instead of the training weights
    timestep_bins: int = 10  # K equal bins partitioning 0..999
    # --- gradient noise scale -----------------------------------------------------------------------------
    gns: bool = True  # global GNS, from gradients the step computes anyway (global_gns_mode, gns_global_every)
    gns_halves: bool = True  # W = A = 1: backward the micro-batch as two halves so global GNS has two batch sizes
    # (same examples and draws: the update equals the one-backward update up to float rounding); false = one backward
    gns_global_every: int = 0  # global GNS at every k-th optimizer step only (modes halves and micro-batches; the
    # other steps: one backward, no norms, full speed); 0 = auto: halves every GLOBAL_EVERY_AUTO (40) steps,
    # micro-batches every MICRO_EVERY_AUTO (4) (<= 2% of step time each), ranks every step; 1 = every step (the
    # reference, SE / sqrt(k)); docs/gns.md
    gns_window: int = 0  # live B_simple averages the last N steps (global and per bin); 0 = auto, see gns_steps
    gns_window_half: bool = True  # the GLOBAL window also never reaches back past half the steps so far (forgets
    # the early |G|^2 transient of short trials; analysis.core.gns.window_span); false = the last gns_window steps.
    # Per-bin
    # windows (sparse: one measurement per gns_every steps) keep the plain gns_window rule
    gns_every: int = 1000  # per-bin GNS cadence in steps (0 = off); one pass (K=10 x 32 examples) costs ~12-13
    # steps of B=32 on a CPU and ~17 of B=256 on a GPU: +1.2-1.7% at 1000 (was 300: +3.3-4.4%; benchmarks/RESULTS.md)
    gns_bin_examples: int = 32  # examples per bin per measurement (split in two halves); 0 = micro_batch_size
    gns_adaln: bool = True  # adaLN-gradient GNS every step, global and per bin, from the step's own per-example
    # gradients of the modulation linears (trainables.gns_adaln; off with compile: true); docs/gns.md
    # --- timestep sampling (trainables.timestep_sampler, docs/allocation.md) ---------------------------------
    timestep_sampling: str = "uniform"  # uniform (today's draws) | noise (p_k ∝ q_k sqrt(m_k) from per-bin GNS) |
    # loss (p_k ∝ q_k sqrt(E[L^2]) of recent steps); noise and loss weight examples by q_k / p_k (unbiased)
    alloc_every: int = 50  # steps between re-estimations of the allocation (noise / loss)
    alloc_floor: float = 0.1  # uniform share mixed into the allocation so no bin starves
    alloc_history: int = 10  # loss: recent per-bin losses kept (uniform until every bin has this many)
    # --- resources (use_gpu, cpus_per_worker in BaseConfig; use_gpu: NCCL, bf16 autocast) ------------------
    bf16: bool = True  # bf16 autocast when on GPU (ignored on CPU)
    threads_per_worker: int = 0  # torch intra-op threads per worker; 0 = cpus_per_worker
    prefetch: int = 2  # micro-batches gathered ahead by a background thread; 0 = in the step (same results)
    compile: bool = False  # torch.compile the model (inductor; trainables.compiling): same math, other kernels

    @property
    def gns_steps(self) -> int:
        """The B_simple window in optimizer steps: ``gns_window``, or (0 = auto) ``DEFAULT_WINDOW`` (100) steps,
        raised to 4 per-bin measurements (``4 x gns_every``) when per-bin GNS measures within ``max_steps``, and to
        ``GLOBAL_MIN_MEASUREMENTS`` global ones (``8 x k``) when global GNS measures every k-th step."""
        if self.gns_window:
            return self.gns_window
        per_bin_on = 0 < self.gns_every <= self.max_steps
        window = max(DEFAULT_WINDOW, 4 * self.gns_every) if per_bin_on else DEFAULT_WINDOW
        return max(window, GLOBAL_MIN_MEASUREMENTS * max(k for _, k in self.global_gns_stages))

    @property
    def global_gns(self) -> str:
        """How this trial measures global GNS: `global_gns_mode` of its settings."""
        return global_gns_mode(self.gns, self.world_size, self.accum, self.micro_batch_size, self.gns_halves)

    @property
    def global_gns_stages(self) -> list[tuple[str, int]]:
        """``(mode, k)`` of each batch-size stage (one without a ``batch_schedule``): where its small batches come
        from (`global_gns_mode`) and its cadence (`global_gns_every`: measured at every k-th step, 0 = never)."""
        unit = self.micro_batch_size * self.world_size
        modes = [global_gns_mode(self.gns, self.world_size, b // unit, self.micro_batch_size, self.gns_halves)
                 for b in self.stages.sizes]  # fmt: skip
        return [(m, global_gns_every(m, self.gns_global_every)) for m in modes]

    @property
    def bin_examples(self) -> int:
        return self.gns_bin_examples or self.micro_batch_size

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "gns_window": self.gns_steps}

    def validate(self) -> None:
        super().validate()
        validate(self)

    @classmethod
    def from_saved(cls, data: dict[str, Any]) -> TrialConfig:
        """A config saved in a checkpoint, possibly by an older version: retired keys are dropped."""
        return config_from_dict(cls, {k: v for k, v in data.items() if k not in RETIRED_KEYS})

    def replace(self, **changes: Any) -> TrialConfig:
        """A copy with ``changes``; an automatic ``gns_window`` stays automatic (it follows ``max_steps``)."""
        return TrialConfig.from_dict({**self.to_dict(), "gns_window": self.gns_window, **changes})


GNS_RANKS, GNS_MICRO, GNS_HALVES, GNS_OFF, GNS_NONE = "ranks", "micro-batches", "halves", "off", "unavailable"


def global_gns_mode(gns: bool, world: int, accum: int, micro: int, halves: bool) -> str:
    """Where a trial's small-batch gradients for global GNS come from (McCandlish et al. 2018, App. A.1).

    ``"ranks"`` (W >= 2): each rank's accumulated gradient, ``b = micro x A``; ``"micro-batches"`` (W = 1, A >= 2):
    every micro-batch's own gradient, ``b = micro``; ``"halves"`` (W = A = 1, ``gns_halves``, micro >= 2): the two
    halves of the micro-batch, each its own backward, ``b = micro / 2``; ``"unavailable"``: no second batch size
    (W = A = 1 without ``gns_halves``, or one example a step); ``"off"``: ``gns`` is false. The big batch is always
    the whole step's gradient (``B``). Pure (no torch): the sweep's start line uses it on trial-config dicts.
    """
    if not gns:
        return GNS_OFF
    if world >= 2:
        return GNS_RANKS
    if accum >= 2:
        return GNS_MICRO
    return GNS_HALVES if halves and micro >= 2 else GNS_NONE


GLOBAL_EVERY_AUTO = 40  # halves: a measured step costs +27-69% of a step (CPU 1.27-1.44x, GPUs 1.52-1.69x), /40
MICRO_EVERY_AUTO = 4  # micro-batches: a measured step costs +4-6% of a CPU step (its norms and buffer copies), /4
GLOBAL_MIN_MEASUREMENTS = 8  # global measurements an auto window holds (8 x k steps) and a trial should end with


def global_gns_every(mode: str, every: int) -> int:
    """Global GNS cadence ``k`` of a stage in ``mode`` (McCandlish et al. 2018, App. A.1): it measures at the
    optimizer steps ``s`` with ``(s + 1) % k == 0`` (``s`` from 0: the k-th, 2k-th, ... step done). ``every``: the
    config's ``gns_global_every`` (0 = auto: ``GLOBAL_EVERY_AUTO`` for ``halves``, ``MICRO_EVERY_AUTO`` for
    ``micro-batches``); ``ranks`` always 1 (the local norm rides on the all-reduce, ~free); 0 = never (``off``,
    ``unavailable``). Skipping steps drops measurements, not examples: every measurement stays unbiased, the window
    holds ``k`` times fewer (SE ~ sqrt(k) wider at a fixed window)."""
    if mode in (GNS_OFF, GNS_NONE):
        return 0
    if mode == GNS_RANKS:
        return 1
    return every or (GLOBAL_EVERY_AUTO if mode == GNS_HALVES else MICRO_EVERY_AUTO)


def measures_global(step: int, k: int) -> bool:
    """Whether 0-based optimizer ``step`` measures global GNS at cadence ``k`` (`global_gns_every`)."""
    return k > 0 and (step + 1) % k == 0


def config_from_dict(cls, data: dict[str, Any], what: str = "config"):
    """Build a frozen config dataclass from YAML / ``--set`` data: unknown keys rejected, values coerced to the
    fields' types, each mistake one `ConfigError` line."""
    if not isinstance(data, dict):
        raise ConfigError(f"a {what} must be a mapping of keys to values, got {type(data).__name__}")
    types = {f.name: str(f.type) for f in fields(cls)}
    unknown = sorted(set(map(str, data)) - set(types))
    if "gns_ema_beta" in unknown and "gns_window" in types:
        raise ConfigError("gns_ema_beta was replaced by gns_window: B_simple now averages the last N steps; drop it")
    if unknown:
        raise ConfigError(f"unknown {what} key(s) {unknown}; valid keys: {sorted(set(types) - {'extra'})}")
    return cls(**{k: _coerce(k, types[k], v) for k, v in data.items()})


def _coerce(key: str, kind: str, value: Any) -> Any:
    """Coerce YAML / ``--set`` values to the field's type, with a clear error. bcrit's YAML reads ``1e-3`` as a
    number (orchestrator/specs/yaml_overrides.py); a quoted number (``lr: "3e-4"``, or one from a plain YAML 1.1
    reader) is still read as one. Booleans are never numbers and numbers never booleans."""
    if value is None or key == "extra":
        return value
    base = kind.split(" ")[0]
    try:
        if base == "bool":
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
                return bool(value)
            raise ValueError
        if base in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ValueError
            if base == "float":
                return float(value)
            if isinstance(value, str):
                value = float(value) if any(c in value for c in ".eE") else int(value)
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"config key {key!r} must be {base}, got {value!r}") from None
    return value


WORKER_RESOURCES_ENV = "BCRIT_WORKER_RESOURCES"  # the test hook (trainables.trial.extra_worker_resources)


def check_gpu_share(c: BaseConfig) -> None:
    """``gpus_per_worker`` below 1 shares a GPU between trials, so it needs ``use_gpu`` (or the accelerator-like test
    hook, trainables.trial.extra_worker_resources, which it scales the same way) and at most one worker per trial
    on a GPU (NCCL refuses two ranks on one device)."""
    if c.gpus_per_worker < 1 and not c.use_gpu and not os.environ.get(WORKER_RESOURCES_ENV):
        raise ConfigError(
            f"gpus_per_worker {c.gpus_per_worker:g} shares a GPU but use_gpu is false; set use_gpu: true, or drop "
            "gpus_per_worker"
        )
    if c.gpus_per_worker < 1 and c.use_gpu and c.num_workers >= 2:
        raise ConfigError(
            f"gpus_per_worker {c.gpus_per_worker:g} with {c.num_workers} workers: two ranks of one DDP trial could "
            "share a GPU, which NCCL refuses; share GPUs between trials of one worker (num_workers 0 or 1), or set "
            "gpus_per_worker: 1"
        )


# --- bounds: one table, checked for every field of every config class --------------------------------------------
@dataclass(frozen=True)
class Bound:
    """The values one config field accepts: a type (``int``, ``float``, ``bool``, ``str``, ``dict``, or ``list``
    of step counts), an interval for numbers (``lo``/``hi`` inclusive unless ``*_open``; ``None`` = unbounded), and
    whether ``None`` is allowed. Numbers must be finite."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    optional: bool = False

    def describe(self) -> str:
        if self.kind == "list":
            return "a list of integers >= 0"
        if self.kind == "stages":
            return "a list of [step, batch_size] pairs"
        if self.kind not in ("int", "float"):
            return f"a {self.kind}"
        fmt = "{:d}" if self.kind == "int" else "{:g}"
        lo, hi = (None if x is None else fmt.format(x) for x in (self.lo, self.hi))
        if lo is not None and hi is not None:
            interval = f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        elif lo is not None:
            interval = f"{'>' if self.lo_open else '>='} {lo}"
        elif hi is not None:
            interval = f"{'<' if self.hi_open else '<='} {hi}"
        else:
            interval = "finite"
        return f"{'an integer' if self.kind == 'int' else 'a number'} {interval}" + (" (or null)" * self.optional)

    def accepts(self, v: Any) -> bool:
        if v is None:
            return self.optional
        if self.kind == "bool":
            return isinstance(v, bool)
        if self.kind == "str":
            return isinstance(v, str) and bool(v.strip())
        if self.kind == "dict":
            return isinstance(v, dict)
        if self.kind == "stages":  # a batch_schedule: its entries are checked by check_schedule
            return isinstance(v, list)
        if self.kind == "list":  # a list of step counts (e.g. keep_steps)
            return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (self.kind == "int" and not isinstance(v, int)):
            return False
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        return not (self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)))


MAX_INT = 2**31 - 1
POS = Bound("int", 1, MAX_INT)  # a positive count
COUNT = Bound("int", 0, MAX_INT)  # a count where 0 means off / default
UNIT = Bound("float", 0, 1, hi_open=True)  # a probability or decay in [0, 1)
# Every field of every config class has a row (tests/trainables/test_config.py checks the tables are full).
BASE_BOUNDS: dict[str, Bound] = {
    "batch_size": POS,
    "micro_batch_size": POS,
    "num_workers": Bound("int", 0, 4096),
    "grad_accum": Bound("int", 1, MAX_INT, optional=True),
    "batch_schedule": Bound("stages"),
    "schedule_lr_rule": Bound("str"),
    "lr": Bound("float", 0, lo_open=True),
    "seed": Bound("int", 0, 2**32 - 1),  # numpy's seed range
    "max_steps": POS,
    "target_loss": Bound("float", 0, lo_open=True, optional=True),
    "divergence_factor": Bound("float", 1, lo_open=True),
    "eval_every": POS,
    "report_every": COUNT,
    "checkpoint_every": COUNT,
    "init_from": Bound("str", optional=True),
    "keep_dir": Bound("str", optional=True),
    "keep_steps": Bound("list"),
    "use_gpu": Bound("bool"),
    "cpus_per_worker": Bound("int", 1, 1024),
    "gpus_per_worker": Bound("float", 0, 1, lo_open=True),
    "extra": Bound("dict"),
}
BaseConfig.BOUNDS = BASE_BOUNDS
BOUNDS: dict[str, Bound] = {  # TrialConfig's
    **BASE_BOUNDS,
    "preset": Bound("str"),
    "dataset": Bound("str"),
    "eval_size": POS,
    "warmup_steps": COUNT,
    "beta1": UNIT,
    "beta2": UNIT,
    "weight_decay": Bound("float", 0),
    "adam_eps": Bound("float", 0, lo_open=True),
    "grad_clip": Bound("float", 0),
    "ema_decay": UNIT,
    "class_dropout": UNIT,
    "eval_repeats": POS,
    "eval_ema": Bound("bool"),
    "timestep_bins": Bound("int", 1, 1000),
    "gns": Bound("bool"),
    "gns_halves": Bound("bool"),
    "gns_global_every": COUNT,
    "gns_window": COUNT,
    "gns_window_half": Bound("bool"),
    "gns_every": COUNT,
    "gns_bin_examples": COUNT,
    "gns_adaln": Bound("bool"),
    "timestep_sampling": Bound("str"),
    "alloc_every": POS,
    "alloc_floor": Bound("float", 0, 1, lo_open=True),
    "alloc_history": POS,
    "bf16": Bound("bool"),
    "threads_per_worker": Bound("int", 0, 1024),
    "prefetch": Bound("int", 0, 64),  # micro-batches gathered ahead (0 = no background gather)
    "compile": Bound("bool"),
}
TrialConfig.BOUNDS = BOUNDS


def check_bounds(config: Any, bounds: dict[str, Bound]) -> None:
    """Raise one ConfigError naming the first field outside its row of ``bounds`` (the value and what is valid)."""
    for f in fields(config):
        b = bounds[f.name]
        v = getattr(config, f.name)
        if not b.accepts(v):
            raise ConfigError(f"{f.name} must be {b.describe()}, got {v!r}")


def check_schedule(c: Any) -> None:
    """A config's ``batch_schedule`` and ``schedule_lr_rule`` (`analysis.core.stages`): one ConfigError line."""
    if c.schedule_lr_rule not in LR_RULES:
        raise ConfigError(f"schedule_lr_rule must be one of {list(LR_RULES)}, got {c.schedule_lr_rule!r}")
    try:
        c.stages  # noqa: B018 (builds and validates the stages)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_sampling(c: TrialConfig) -> None:
    """The timestep-sampling settings (docs/allocation.md): a known sampler; ``noise`` needs per-bin GNS."""
    if c.timestep_sampling not in SAMPLERS:
        raise ConfigError(f"timestep_sampling must be one of {list(SAMPLERS)}, got {c.timestep_sampling!r}")
    if c.timestep_sampling == "noise" and not 0 < c.gns_every <= c.max_steps:
        raise ConfigError(
            "timestep_sampling: noise allocates by the per-bin GNS measurements; set gns_every to a step count "
            f"in 1..max_steps ({c.max_steps}), e.g. gns_every: {min(c.max_steps, c.alloc_every)}"
        )


def check_global_cadence(c: TrialConfig) -> None:
    """A set ``gns_global_every`` must measure within ``max_steps`` and, with a set ``gns_window``, leave >= 2
    measurements in it (the per-bin rule). The auto cadence is never an error: a trial too short for it says so."""
    k = max(k for _, k in c.global_gns_stages)
    if not c.gns_global_every or k <= 1:
        return
    if k > c.max_steps:
        raise ConfigError(
            f"gns_global_every {k} > max_steps {c.max_steps}: global GNS would never measure; set it <= "
            f"{c.max_steps} (1 = every step, 0 = auto)"
        )
    if c.gns_window and c.gns_window < 2 * k:
        raise ConfigError(
            f"gns_window {c.gns_window} steps holds fewer than 2 global GNS measurements (gns_global_every {k}), "
            f"too few for a standard error; set gns_window >= {2 * k} (or 0 = auto), or gns_global_every <= "
            f"{max(1, c.gns_window // 2)}"
        )


def validate(c: TrialConfig) -> None:
    """The DiT's own checks, after the shared ones of `BaseConfig.validate` (each field against its row of `BOUNDS`,
    the split, the schedule, the checkpoint cadence): one ConfigError for the first impossible setting, before any
    worker starts."""
    if c.preset not in PRESETS:
        raise ConfigError(f"unknown preset {c.preset!r}; choose one of {list(PRESETS)}")
    if c.gns_window and 0 < c.gns_every <= c.max_steps and c.gns_window < 2 * c.gns_every:
        raise ConfigError(
            f"gns_window {c.gns_window} steps holds fewer than 2 per-bin GNS measurements (gns_every "
            f"{c.gns_every}), too few for a standard error; set gns_window >= {2 * c.gns_every} (or 0 = auto)"
        )
    check_global_cadence(c)
    if c.gns_every and c.bin_examples < 2:
        raise ConfigError("per-bin GNS needs gns_bin_examples >= 2 (two halves of at least one example)")
    if c.gns_every and c.bin_examples % 2:
        raise ConfigError(f"gns_bin_examples must be even (two equal halves), got {c.bin_examples}")
    check_sampling(c)
    if c.eval_size < c.timestep_bins:
        raise ConfigError(f"eval_size {c.eval_size} must be >= timestep_bins {c.timestep_bins}")
    if c.dataset != "digits" and not os.path.isdir(c.dataset):
        raise ConfigError(
            f"dataset {c.dataset!r} is neither 'digits' nor an existing packed latent store (bcrit pack-latents) "
            "or fast-DiT latent folder (with imagenet256_features/ and imagenet256_labels/)"
        )
