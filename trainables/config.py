"""The trial's configuration: one frozen pydantic dataclass per workload; everything that changes a result lives
here, and all of it is logged (MLflow params, checkpoint, summary). Each field's type carries its range (`Bound`),
so pydantic checks types, ranges and unknown keys, reads number strings (``"3E-4"``, ``"1e5"``) as numbers and writes
the JSON Schema (``bcrit schema trial``); each rule across fields is one ``check_*`` validator. Every mistake is one
`ConfigError` line naming the key, the value and the fix."""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import pydantic
from pydantic import BeforeValidator, Field, ValidationError, model_validator

from analysis.core.allocation import SAMPLERS
from analysis.core.bcrit_error import BcritError, did_you_mean
from analysis.core.gns import DEFAULT_WINDOW
from analysis.core.lr_rules import LR_RULES
from analysis.core.stages import BatchStages
from trainables.presets import PRESETS

# keys older checkpoints may hold: old key -> (its replacement, why)
RETIRED_KEYS = {"gns_ema_beta": ("gns_window", "B_simple now averages the last N steps")}


class ConfigError(BcritError):
    """A user mistake in a trial configuration; the message is one line that names the problem and the fix."""


# --- bounds: each field's type names the values it accepts ------------------------------------------------------
@dataclass(frozen=True)
class Bound:
    """The values one config field accepts: a type (``int``, ``float``, ``bool``, ``str``, ``dict``, ``list`` of
    step counts, ``stages``), an interval for numbers (``lo``/``hi`` inclusive unless ``*_open``; ``None`` =
    unbounded; numbers finite), closed ``choices`` for a string, and whether ``None`` is allowed. `type` is the
    field's annotation: pydantic enforces it (and writes it into the JSON Schema)."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    optional: bool = False
    choices: tuple[str, ...] = ()

    @property
    def type(self) -> Any:
        base = Literal[self.choices] if self.choices else _TYPES[self.kind]
        meta: list = []
        if self.kind in ("int", "float"):
            ends = {"gt" if self.lo_open else "ge": self.lo, "lt" if self.hi_open else "le": self.hi}
            finite = {"allow_inf_nan": False} if self.kind == "float" else {}
            meta = [Field(**{k: v for k, v in ends.items() if v is not None}, **finite), BeforeValidator(_number)]
        elif self.kind == "str" and not self.choices:
            meta = [Field(pattern=r"\S")]  # not blank
        elif self.kind == "stages":  # its entries: checked by check_schedule (analysis.core.stages)
            pair = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2}
            meta = [Field(json_schema_extra={"items": pair})]
        inner = Annotated[(base, *meta)] if meta else base
        return Annotated[inner | None if self.optional else inner, self]

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


def _number(value: Any) -> Any:
    """YAML / ``--set`` numbers: a number string reads as its number (``"1e-3"``, ``"3E-4"``, ``"1e5"``; bcrit's YAML
    already reads unquoted ones, orchestrator/specs/yaml_overrides.py); a boolean is never a number."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass  # pydantic names it
    return value


MAX_INT = 2**31 - 1
_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "dict": dict, "stages": list,
          "list": list[Annotated[int, Field(ge=0), BeforeValidator(_number)]]}  # fmt: skip


def Int(lo: int, hi: int = MAX_INT, **kw: Any) -> Any:
    return Bound("int", lo, hi, **kw).type


def Float(lo: float | None = None, hi: float | None = None, **kw: Any) -> Any:
    return Bound("float", lo, hi, **kw).type


def Choice(options: Any) -> Any:
    return Bound("str", choices=tuple(options)).type


POS, COUNT, UNIT = Int(1), Int(0), Float(0, 1, hi_open=True)  # a positive count, a count (0: off / auto), [0, 1)
POSITIVE, LR_RULE = Float(0, lo_open=True), Choice(LR_RULES)  # a number > 0, a later stage's lr rule
FLAG, TEXT, STEPS, STAGES, TAGS = (Bound(k).type for k in ("bool", "str", "list", "stages", "dict"))
OPTIONAL_TEXT = Bound("str", optional=True).type


def config_class(cls: type) -> type:
    """Declare a config class (`BaseConfig`, a workload's subclass): a frozen pydantic dataclass, unknown keys
    refused, every field's `Bound` in ``cls.BOUNDS``, and a ValidationError turned into one `ConfigError` line."""
    cls = pydantic.dataclasses.dataclass(frozen=True, config=pydantic.ConfigDict(extra="forbid"))(cls)
    bounds = {n: [m for m in f.metadata if isinstance(m, Bound)] for n, f in cls.__pydantic_fields__.items()}
    if missing := [n for n, b in bounds.items() if not b]:
        raise TypeError(f"{cls.__name__} fields {missing} need a bounded type (trainables.config: Int, Float, POS...)")
    cls.BOUNDS = {n: b[0] for n, b in bounds.items()}
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, /, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except ValidationError as e:
            raise one_line(type(self), e, kwargs) from None

    cls.__init__ = __init__
    return cls


_RANGE = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"}


def one_line(cls: Any, e: ValidationError, given: dict) -> ConfigError:
    """The ConfigError line of a config's first mistake: all unknown keys (with the closest valid one), else the
    first field's value against its `Bound`, else a ``check_*`` validator's own line."""
    errors = e.errors()
    valid = sorted(set(cls.BOUNDS) - {"extra"})
    unknown = sorted(str(err["loc"][0]) for err in errors if err["type"] == "unexpected_keyword_argument")
    for key in unknown:
        if key in RETIRED_KEYS and RETIRED_KEYS[key][0] in valid:
            return ConfigError(f"{key} was replaced by {RETIRED_KEYS[key][0]}: {RETIRED_KEYS[key][1]}; drop it")
    if unknown:
        return ConfigError(f"unknown {cls.WHAT} key(s) {unknown}{did_you_mean(unknown, valid)}; valid keys: {valid}")
    err = errors[0]
    if isinstance(err.get("ctx", {}).get("error"), ConfigError):
        return err["ctx"]["error"]
    if not err["loc"] or err["loc"][0] not in cls.BOUNDS:
        return ConfigError(f"{cls.WHAT}: {err['msg']}")
    key = err["loc"][0]
    b, value = cls.BOUNDS[key], given.get(key, err["input"])
    if b.choices:
        return ConfigError(f"unknown {key} {value!r}; {key} must be one of {list(b.choices)}")
    if value is not None and b.kind in ("int", "float", "bool") and err["type"] not in _RANGE:
        return ConfigError(f"config key {key!r} must be {b.kind}, got {value!r}")
    return ConfigError(f"{key} must be {b.describe()}, got {value!r}")


WORKER_RESOURCES_ENV = "BCRIT_WORKER_RESOURCES"  # the test hook (trainables.trial.extra_worker_resources)


@config_class
class BaseConfig:
    """The fields every workload's trial config shares: the batch size and its split, the learning rate and seed,
    the step budget and stop rules, the evaluation / report / checkpoint cadence (what the skeleton reads,
    `trainables.skeleton.ScheduleConfig`), the branched study's keys, the resources, and free-form tags. A workload's
    config subclasses it with `config_class` (re-declaring a field, with its type, only to change its default) and
    adds its own ``check_*`` validators."""

    # --- the scientific variable and how it is split ------------------------------------------------------
    batch_size: POS = 32  # effective B = micro_batch_size * grad_accum * num_workers
    micro_batch_size: POS = 32  # examples per forward/backward on one worker
    num_workers: Int(0, 4096) = 0  # W data-parallel ranks; 0 = run in-process (no worker actors), counts as 1
    grad_accum: Int(1, optional=True) = None  # A; None = derived from the three above (of batch_size: stage 0)
    batch_schedule: STAGES = field(default_factory=list)  # [[step, B], ...]: from `step` steps done on, batch B, by
    # accumulation (micro and W fixed); [] = batch_size throughout (analysis.core.stages, docs/schedule.md)
    schedule_lr_rule: LR_RULE = "sqrt"  # a later stage's lr = lr x sqrt(B / batch_size) (Adam); linear | constant
    lr: POSITIVE = 1e-3  # peak learning rate
    seed: Int(0, 2**32 - 1) = 0  # numpy's seed range
    # --- budget and stopping (decided inside the loop, not by a Tune stopper: docs/design.md) -------------------
    max_steps: POS = 200  # step budget
    target_loss: Float(0, lo_open=True, optional=True) = None  # stop once eval/loss <= this
    divergence_factor: Float(1, lo_open=True) = 3.0  # diverged: eval/loss > factor x first (or a non-finite loss)
    eval_every: POS = 10  # steps between held-out evaluations
    # --- reporting and checkpoints ------------------------------------------------------------------------
    report_every: COUNT = 0  # steps between reports to Ray; 0 = eval_every
    checkpoint_every: COUNT = 0  # steps between checkpoints (a multiple of report_every); 0 = only at the end
    # --- branched study (trainables.branch_points) -------------------------------------------------------------
    init_from: OPTIONAL_TEXT = None  # start from this checkpoint (weights, optimizer state; counters reset)
    keep_dir: OPTIONAL_TEXT = None  # copy the checkpoints at keep_steps to <keep_dir>/step<N> (branch points)
    keep_steps: STEPS = field(default_factory=list)  # steps whose checkpoints are kept (multiples of checkpoint_every)
    # --- resources ----------------------------------------------------------------------------------------
    use_gpu: FLAG = False  # a GPU per worker (or per in-process trial)
    cpus_per_worker: Int(1, 1024) = 1
    gpus_per_worker: Float(0, 1, lo_open=True) = 1.0  # each worker's share of a GPU: 0.25 packs four on one (use_gpu)
    extra: TAGS = field(default_factory=dict, compare=False, repr=False)  # free-form tags (not used by training)

    BOUNDS: ClassVar[dict[str, Bound]]  # every field's row (set by config_class from the fields' types)
    WHAT: ClassVar[str] = "config"  # how its errors name it ("unknown <WHAT> key ...")

    def __post_init__(self) -> None:
        if "BOUNDS" not in type(self).__dict__:  # a plain @dataclass subclass would skip every check
            raise TypeError(f"declare {type(self).__name__} with @trainables.config.config_class")

    @model_validator(mode="after")
    def check_split(self) -> BaseConfig:
        """batch_size = micro_batch_size x grad_accum x workers."""
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
        return self

    @model_validator(mode="after")
    def check_schedule(self) -> BaseConfig:
        """The ``batch_schedule`` (`analysis.core.stages`)."""
        try:
            self.stages  # noqa: B018 (builds and validates the stages)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return self

    @model_validator(mode="after")
    def check_gpu_share(self) -> BaseConfig:
        """``gpus_per_worker`` below 1 shares a GPU between trials, so it needs ``use_gpu`` (or the accelerator-like
        test hook, trainables.trial.extra_worker_resources, which it scales the same way) and at most one worker per
        trial on a GPU (NCCL refuses two ranks on one device)."""
        if self.gpus_per_worker < 1 and not self.use_gpu and not os.environ.get(WORKER_RESOURCES_ENV):
            raise ConfigError(
                f"gpus_per_worker {self.gpus_per_worker:g} shares a GPU but use_gpu is false; set use_gpu: true, or "
                "drop gpus_per_worker"
            )
        if self.gpus_per_worker < 1 and self.use_gpu and self.num_workers >= 2:
            raise ConfigError(
                f"gpus_per_worker {self.gpus_per_worker:g} with {self.num_workers} workers: two ranks of one DDP "
                "trial could share a GPU, which NCCL refuses; share GPUs between trials of one worker (num_workers 0 "
                "or 1), or set gpus_per_worker: 1"
            )
        return self

    @model_validator(mode="after")
    def check_checkpoint_cadence(self) -> BaseConfig:
        if self.checkpoint_every and self.checkpoint_every % self.report_interval:
            raise ConfigError(
                f"checkpoint_every {self.checkpoint_every} must be a multiple of report_every {self.report_interval}"
            )
        return self

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
        """From YAML / ``--set`` data or a saved config dict: unknown keys refused, number strings read as numbers,
        each mistake one `ConfigError` line."""
        if not isinstance(data, dict):
            raise ConfigError(f"a {cls.WHAT} must be a mapping of keys to values, got {type(data).__name__}")
        return cls(**{str(k): v for k, v in data.items()})


@config_class
class TrialConfig(BaseConfig):
    """The DiT trial (`trainables.loop`): the shared fields of `BaseConfig` and the model's, data's, optimiser's,
    evaluation's, GNS's and timestep sampler's own."""

    # --- model and data --------------------------------------------------------------------------------
    preset: Choice(PRESETS) = "tiny"  # key of trainables.presets.PRESETS
    dataset: TEXT = "digits"  # "digits" (ships with the package), a packed latent store or a fast-DiT latent folder
    eval_size: POS = 297  # held-out examples (digits: the last 297 of a seeded shuffle; latents: last files)
    # --- optimisation (nuisance hyper-parameters; lr in BaseConfig: the AdamW peak learning rate) -----------
    warmup_steps: COUNT = 0  # linear warm-up, then constant
    beta1: UNIT = 0.9
    beta2: UNIT = 0.999
    weight_decay: Float(0) = 0.0
    adam_eps: POSITIVE = 1e-8
    grad_clip: Float(0) = 0.0  # max global grad norm; 0 = no clipping
    ema_decay: UNIT = 0.0  # EMA of weights (diffusers EMAModel); 0 = off
    class_dropout: UNIT = 0.1  # classifier-free guidance label dropout probability
    # --- evaluation for steps-to-target ------------------------------------------------------------------
    eval_repeats: POS = 2  # fixed noise draws per held-out example (more = lower-noise eval loss)
    eval_ema: FLAG = False  # evaluate the EMA weights instead of the training weights
    timestep_bins: Int(1, 1000) = 10  # K equal bins partitioning 0..999
    # --- gradient noise scale -----------------------------------------------------------------------------
    gns: FLAG = True  # global GNS, from gradients the step computes anyway (global_gns_mode, gns_global_every)
    gns_halves: FLAG = True  # W = A = 1: backward the micro-batch as two halves so global GNS has two batch sizes
    # (same examples and draws: the update equals the one-backward update up to float rounding); false = one backward
    gns_global_every: COUNT = 0  # global GNS at every k-th optimizer step only (modes halves and micro-batches; the
    # other steps: one backward, no norms, full speed); 0 = auto: halves every GLOBAL_EVERY_AUTO (40) steps,
    # micro-batches every MICRO_EVERY_AUTO (4) (<= 2% of step time each), ranks every step; 1 = every step (the
    # reference, SE / sqrt(k)); docs/gns.md
    gns_window: COUNT = 0  # live B_simple averages the last N steps (global and per bin); 0 = auto, see gns_steps
    gns_window_half: FLAG = True  # the GLOBAL window also never reaches back past half the steps so far (forgets
    # the early |G|^2 transient of short trials; analysis.core.gns.window_span); false = the last gns_window steps.
    # Per-bin windows (sparse: one measurement per gns_every steps) keep the plain gns_window rule
    gns_every: COUNT = 1000  # per-bin GNS cadence in steps (0 = off); one pass (K=10 x 32 examples) costs ~12-13
    # steps of B=32 on a CPU and ~17 of B=256 on a GPU: +1.2-1.7% at 1000 (was 300: +3.3-4.4%; benchmarks/RESULTS.md)
    gns_bin_examples: COUNT = 32  # examples per bin per measurement (split in two halves); 0 = micro_batch_size
    gns_adaln: FLAG = True  # adaLN-gradient GNS every step, global and per bin, from the step's own per-example
    # gradients of the modulation linears (trainables.gns_adaln; off with compile: true); docs/gns.md
    # --- timestep sampling (trainables.timestep_sampler, docs/allocation.md) ---------------------------------
    timestep_sampling: Choice(SAMPLERS) = "uniform"  # uniform (today's draws) | noise (p_k ∝ q_k sqrt(m_k) from
    # per-bin GNS) | loss (p_k ∝ q_k sqrt(E[L^2]) of recent steps); noise, loss weight examples by q_k / p_k (unbiased)
    alloc_every: POS = 50  # steps between re-estimations of the allocation (noise / loss)
    alloc_floor: Float(0, 1, lo_open=True) = 0.1  # uniform share mixed into the allocation so no bin starves
    alloc_history: POS = 10  # loss: recent per-bin losses kept (uniform until every bin has this many)
    # --- resources (use_gpu, cpus_per_worker in BaseConfig; use_gpu: NCCL, bf16 autocast) ------------------
    bf16: FLAG = True  # bf16 autocast when on GPU (ignored on CPU)
    threads_per_worker: Int(0, 1024) = 0  # torch intra-op threads per worker; 0 = cpus_per_worker
    prefetch: Int(0, 64) = 2  # micro-batches gathered ahead by a background thread; 0 = in the step (same results)
    compile: FLAG = False  # torch.compile the model (inductor; trainables.compiling): same math, other kernels

    @model_validator(mode="after")
    def check_bin_window(self) -> TrialConfig:
        """A set ``gns_window`` holds >= 2 per-bin measurements when per-bin GNS measures within ``max_steps``."""
        if self.gns_window and 0 < self.gns_every <= self.max_steps and self.gns_window < 2 * self.gns_every:
            raise ConfigError(
                f"gns_window {self.gns_window} steps holds fewer than 2 per-bin GNS measurements (gns_every "
                f"{self.gns_every}), too few for a standard error; set gns_window >= {2 * self.gns_every} (or 0 = auto)"
            )
        return self

    @model_validator(mode="after")
    def check_global_cadence(self) -> TrialConfig:
        """A set ``gns_global_every`` must measure within ``max_steps`` and, with a set ``gns_window``, leave >= 2
        measurements in it (the per-bin rule). The auto cadence is never an error: a trial too short for it says so."""
        k = max(k for _, k in self.global_gns_stages)
        if not self.gns_global_every or k <= 1:
            return self
        if k > self.max_steps:
            raise ConfigError(
                f"gns_global_every {k} > max_steps {self.max_steps}: global GNS would never measure; set it <= "
                f"{self.max_steps} (1 = every step, 0 = auto)"
            )
        if self.gns_window and self.gns_window < 2 * k:
            raise ConfigError(
                f"gns_window {self.gns_window} steps holds fewer than 2 global GNS measurements (gns_global_every "
                f"{k}), too few for a standard error; set gns_window >= {2 * k} (or 0 = auto), or gns_global_every <= "
                f"{max(1, self.gns_window // 2)}"
            )
        return self

    @model_validator(mode="after")
    def check_bin_examples(self) -> TrialConfig:
        if self.gns_every and self.bin_examples < 2:
            raise ConfigError("per-bin GNS needs gns_bin_examples >= 2 (two halves of at least one example)")
        if self.gns_every and self.bin_examples % 2:
            raise ConfigError(f"gns_bin_examples must be even (two equal halves), got {self.bin_examples}")
        return self

    @model_validator(mode="after")
    def check_sampling(self) -> TrialConfig:
        """Timestep sampling ``noise`` allocates by per-bin GNS (docs/allocation.md), so it needs it."""
        if self.timestep_sampling == "noise" and not 0 < self.gns_every <= self.max_steps:
            raise ConfigError(
                "timestep_sampling: noise allocates by the per-bin GNS measurements; set gns_every to a step count "
                f"in 1..max_steps ({self.max_steps}), e.g. gns_every: {min(self.max_steps, self.alloc_every)}"
            )
        return self

    @model_validator(mode="after")
    def check_data(self) -> TrialConfig:
        """The held-out set covers every timestep bin; the dataset exists."""
        if self.eval_size < self.timestep_bins:
            raise ConfigError(f"eval_size {self.eval_size} must be >= timestep_bins {self.timestep_bins}")
        if self.dataset != "digits" and not os.path.isdir(self.dataset):
            raise ConfigError(
                f"dataset {self.dataset!r} is neither 'digits' nor an existing packed latent store (bcrit "
                "pack-latents) or fast-DiT latent folder (with imagenet256_features/ and imagenet256_labels/)"
            )
        return self

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

    @classmethod
    def from_saved(cls, data: dict[str, Any]) -> TrialConfig:
        """A config saved in a checkpoint, possibly by an older version: retired keys are dropped."""
        return cls.from_dict({k: v for k, v in data.items() if k not in RETIRED_KEYS})

    def replace(self, **changes: Any) -> TrialConfig:
        """A copy with ``changes``; an automatic ``gns_window`` stays automatic (it follows ``max_steps``)."""
        return TrialConfig.from_dict({**self.to_dict(), "gns_window": self.gns_window, **changes})


BOUNDS = TrialConfig.BOUNDS  # each field's Bound (from its type)
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
