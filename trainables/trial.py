"""Running one trial: as a Ray Train ``TorchTrainer`` (DDP over ``num_workers`` workers; gloo on CPU, NCCL on
GPU; ``num_workers=0`` in-process), or with no Ray at all (`run_local`, for fast tests and benchmarks).

`check_trial` validates everything that can be known before a worker starts (config, dataset, preset vs image
size, resources) and raises one `ConfigError`. A trial packed on a GPU (``gpus_per_worker < 1``) caps its own CUDA
memory at its share right after its session picks the device (`gpu_share`), so it fails itself, with one line
(`GpuShareError`), rather than the trials beside it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable

import torch

from trainables import quiet_exit, quiet_user_errors
from trainables.checkpoint import UnsafeCheckpoint
from trainables.compiling import check_compile, compile_failure_in
from trainables.config import WORKER_RESOURCES_ENV, ConfigError, TrialConfig
from trainables.data import DatasetError, dataset_error_in, describe_dataset
from trainables.exc_chain import exception_in_chain
from trainables.loop import train_loop
from trainables.presets import PRESETS
from trainables.skeleton import LocalSession, opened
from trainables.sweep_signal import SIGNAL_KEY, TRIAL_KEY, SignalReader


def check_trial(cfg: TrialConfig, resources: dict | None = None) -> None:
    """Raise ConfigError for a dataset that is missing or malformed, an image size the patch size does not
    divide, ``compile: true`` where torch.compile cannot run, or more workers than the CPUs/GPUs available
    (``resources`` as ``ray.cluster_resources()``; default: this machine)."""
    try:
        info = describe_dataset(cfg.dataset, cfg.eval_size)
    except DatasetError as e:
        raise ConfigError(str(e)) from None
    patch = PRESETS[cfg.preset].patch_size
    if info.image_size % patch:
        raise ConfigError(f"image size {info.image_size} of {info.name} is not divisible by patch size {patch}")
    if cfg.compile and (not cfg.use_gpu or torch.cuda.is_available()):  # a GPU-less driver cannot judge GPU workers
        check_compile("cuda" if cfg.use_gpu else "cpu")
    if resources is None:
        resources = {"CPU": os.cpu_count() or 1, "GPU": torch.cuda.device_count()}
    if cfg.use_gpu and resources.get("GPU", 0) < cfg.world_size * cfg.gpus_per_worker:
        raise ConfigError(
            f"{cfg.world_size} GPU worker(s) x {cfg.gpus_per_worker:g} GPU asked for but "
            f"{resources.get('GPU', 0):g} GPU(s) available; lower num_workers or gpus_per_worker, or set use_gpu=false"
        )
    need = cfg.world_size * cfg.cpus_per_worker
    if not cfg.use_gpu and need > resources.get("CPU", 0):
        raise ConfigError(
            f"{cfg.world_size} worker(s) x {cfg.cpus_per_worker} CPU need {need} CPUs but "
            f"{int(resources.get('CPU', 0))} are available; lower num_workers or cpus_per_worker"
        )


# --- a share of a GPU ---------------------------------------------------------------------------------------------
class GpuShareError(ConfigError):
    """A trial packed at ``gpus_per_worker < 1`` ran out of its share of the GPU's memory (one line: the share, the
    fix)."""


def cap_gpu_memory(device: torch.device | str, share: float) -> bool:
    """Cap this process's CUDA memory (PyTorch's caching allocator) at ``share`` of ``device`` when the trial holds
    part of a GPU (``gpus_per_worker < 1``), so a packed trial that outgrows its share fails itself, not its
    neighbours. Nothing for a whole GPU or on a CPU; True when capped."""
    if share >= 1 or torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return False
    torch.cuda.set_per_process_memory_fraction(share, _cuda_index(device))
    return True


def _cuda_index(device: torch.device | str) -> int:
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def gpu_share_oom(exc: BaseException, share: float, device: torch.device | str) -> GpuShareError | None:
    """The CUDA out-of-memory error behind ``exc`` (chained, or inside Ray Train's wrappers) of a trial capped at
    ``share``, as one line naming the share and the fix; else None."""
    if exception_in_chain(exc, torch.cuda.OutOfMemoryError) is None:
        return None
    try:
        total = torch.cuda.get_device_properties(_cuda_index(device)).total_memory / 2**30
        of = f" ({share * total:.3g} of {total:.3g} GiB)"
    except Exception:  # no device to ask (a CPU test): the share alone
        of = ""
    return GpuShareError(
        f"CUDA out of memory within this trial's share of the GPU, gpus_per_worker {share:g}{of}: lower "
        "micro_batch_size (more accumulation, the same batch_size) or batch_size, or raise gpus_per_worker"
    )


@contextlib.contextmanager
def gpu_share(share: float, device: torch.device | str):
    """Run a trial's loop within its share of a GPU: `cap_gpu_memory` on entry (undone on exit: an in-process
    trial's process lives on), a CUDA out-of-memory error of a capped trial as its `GpuShareError`."""
    capped = cap_gpu_memory(device, share)
    try:
        yield capped
    except Exception as e:
        bad = gpu_share_oom(e, share, device) if capped else None
        if bad is None:
            raise
        raise bad from e
    finally:
        if capped:
            torch.cuda.set_per_process_memory_fraction(1.0, _cuda_index(device))


# --- sessions ------------------------------------------------------------------------------------------------
def quiet_report_log() -> None:
    """Ray Train logs every report at INFO with its whole payload (our ``rows``: lines of thousands of characters),
    from a logger named after the file rather than the module, which Train's ``LoggingConfig`` does not reach."""
    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).setLevel(logging.WARNING)


class RaySession:
    """Session of a Ray Train worker (V2 API)."""

    def __init__(self, signal: str | None = None, trial_id: str | None = None):
        import ray.train
        import ray.train.torch

        self.sweep_ended = SignalReader(signal, trial_id)  # end at the goal / stopped behind (trainables.sweep_signal)
        quiet_report_log()
        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        try:
            self.device = ray.train.torch.get_device()
        except Exception:  # local mode (num_workers=0) has no accelerator setup
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def report(self, metrics: dict, checkpoint_dir: str | None) -> None:
        import ray.train

        ckpt = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        ray.train.report(metrics, checkpoint=ckpt)

    def restore(self):
        import ray.train

        return opened(ray.train.get_checkpoint())


# --- runners ---------------------------------------------------------------------------------------------------
def run_local(cfg: TrialConfig, checkpoint_root: str | None = None, resume_from: str | None = None) -> LocalSession:
    """Run the whole trial in this process (``num_workers`` must be 0 or 1); returns the session with its reports."""
    if cfg.world_size != 1:
        raise ConfigError("run_local runs one worker; use run_trial for num_workers >= 2")
    session = LocalSession(checkpoint_root, resume_from, "cuda" if cfg.use_gpu else "cpu")
    with gpu_share(cfg.gpus_per_worker, session.device):
        session.summary = train_loop(cfg, session)
    return session


def train_func(config: dict, config_cls: type = TrialConfig, loop: Callable | None = None) -> dict:
    """What each Ray Train worker runs, for every workload: ``loop(config_cls.from_dict(config["trial"]),
    RaySession())``; default: the DiT trial. Bind another workload with ``functools.partial`` (e.g.
    `orchestrator.execution.tune_trainable.Workload.train_func`): Ray Train counts one required argument either way."""
    quiet_exit.install()  # ended by Ray's SIGTERM inside a finalizer: no traceback (trainables.quiet_exit)
    quiet_user_errors.install()  # a BcritError raised here: the driver's one line, not Ray Train's traceback too
    cfg = config_cls.from_dict(config["trial"])
    session = RaySession(config.get(SIGNAL_KEY), config.get(TRIAL_KEY))
    with gpu_share(cfg.gpus_per_worker, session.device):
        return (loop or train_loop)(cfg, session)


def extra_worker_resources(share: float = 1.0) -> dict[str, float]:
    """Test hook (docs/cluster.md): ``BCRIT_WORKER_RESOURCES='{"fake_gpu": 1}'`` adds these custom resources to
    every Train worker's request, so CPU trials are placed one worker per accelerator-like slot as GPU trials
    would be; ``share`` (the config's ``gpus_per_worker``) scales them as it scales a GPU. Unset (always, outside
    tests and rehearsals): nothing; ``use_gpu`` is unaffected either way."""
    raw = os.environ.get(WORKER_RESOURCES_ENV)
    return {str(k): share * float(v) for k, v in json.loads(raw).items()} if raw else {}


def build_trainer(
    cfg: TrialConfig,
    *,
    name: str,
    storage_path: str,
    callbacks=(),
    max_failures: int = 0,
    train_loop=None,
    log_level: str = "WARNING",
    signal: str | None = None,
    trial_id: str | None = None,
):
    """A ``TorchTrainer`` for the trial. A run of the same ``name`` in ``storage_path`` resumes from its
    latest checkpoint (Ray Train V2), which is how a retried or restored Tune trial continues. ``train_loop``:
    the per-worker function taking ``{"trial": cfg.to_dict()}`` (default: the DiT trial's `train_func`; another
    workload's, `train_func` bound to its config class and loop, with a config of the same resource fields).
    ``log_level``: Ray Train's console logging (INFO shows worker-group set-up and checkpoint lines). ``signal``: the
    name of the sweep's `trainables.sweep_signal.GoalSignal` its workers ask at each evaluation (None: none), as the
    Tune trial ``trial_id`` (what the sweep names a trial it stops alone by)."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    scaling = ScalingConfig(
        num_workers=cfg.num_workers,
        use_gpu=cfg.use_gpu,
        resources_per_worker={
            "CPU": cfg.cpus_per_worker,
            **({"GPU": cfg.gpus_per_worker} if cfg.use_gpu else {}),
            **extra_worker_resources(cfg.gpus_per_worker),
        },
    )
    run = RunConfig(
        name=name,
        storage_path=storage_path,
        failure_config=FailureConfig(max_failures=max_failures),
        checkpoint_config=CheckpointConfig(num_to_keep=2),
        callbacks=list(callbacks),
        logging_config=LoggingConfig(log_level=log_level),
    )
    return TorchTrainer(
        train_loop or train_func,
        train_loop_config={"trial": cfg.to_dict(), **({SIGNAL_KEY: signal, TRIAL_KEY: trial_id} if signal else {})},
        scaling_config=scaling,
        run_config=run,
        torch_config=TorchConfig(backend="nccl" if cfg.use_gpu else "gloo"),
    )


STORE_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION")


def ensure_ray(num_cpus: int | None = None, quiet: bool = False) -> None:
    """Connect to ``RAY_ADDRESS`` when set, else start a local Ray (embedded default). On small machines the
    logical CPUs are over-subscribed: each Tune driver takes a CPU besides its workers (docs/design.md). ``quiet``:
    the driver's own Ray logger says only errors (not its start-up INFO and token-auth notice)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
    if not os.environ.get("RAY_ADDRESS"):  # one machine: no node is drained, so no watcher actor per Train run
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    level = logging.ERROR if quiet else logging.INFO
    if os.environ.get("RAY_ADDRESS"):
        # the test hook's variable and where the object store is (an S3-compatible endpoint, the region) reach the
        # trial processes on every node, which do not inherit our env; credentials do not travel (each node has its
        # own: an instance role or its environment; docs/cluster.md)
        hook = {k: os.environ[k] for k in (WORKER_RESOURCES_ENV, *STORE_ENV) if os.environ.get(k)}
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True, logging_level=level,
                 runtime_env={"env_vars": hook} if hook else None)  # fmt: skip
    else:
        # address="local": start our own Ray even when another is running on this machine (a plain ray.init
        # would connect to it and then refuse num_cpus). The dashboard (127.0.0.1) serves the state API that
        # Ray Train's placement-group cleaner polls.
        ray.init(address="local", num_cpus=num_cpus or max(4, (os.cpu_count() or 1) * 2), log_to_driver=True,
                 logging_level=level)  # fmt: skip


def run_trial(
    cfg: TrialConfig,
    *,
    name: str,
    storage_path: str | None = None,
    max_failures: int = 0,
    callbacks=(),
    log_level: str = "WARNING",
    resources: dict | None = None,
) -> dict:
    """Validate (against ``resources``, default this machine), then fit the trial; returns rank 0's summary.
    Checkpoints live under ``<storage>/<name>`` for every ``num_workers`` (in-process too), and a run of the same
    name resumes -- if its config may continue it (trainables.resume). ``summary["note"]``: a damaged checkpoint
    that was skipped, else absent. ``callbacks``: Ray Train ``UserCallback``s (e.g.
    orchestrator.records.progress.ProgressFileCallback; Ray Train runs only with ``num_workers >= 1``);
    ``log_level``: Ray
    Train's console logging."""
    from trainables.resume import resume_point

    check_trial(cfg, resources)
    storage_path = os.path.abspath(storage_path or os.path.join(tempfile.gettempdir(), "bcrit-runs"))
    run_dir = os.path.join(storage_path, name)
    resume_from, note = resume_point(run_dir, cfg.to_dict(), can_fall_back=cfg.num_workers == 0)
    if cfg.num_workers == 0:  # in-process: Ray Train's local mode writes nothing under storage_path
        os.makedirs(run_dir, exist_ok=True)
        session = LocalSession(run_dir, resume_from, "cuda" if cfg.use_gpu else "cpu", keep=2)
        try:
            with gpu_share(cfg.gpus_per_worker, session.device):
                summary = dict(train_loop(cfg, session))
        except DatasetError as e:  # a bad latent file met mid-training: its one line
            raise ConfigError(str(e)) from None
        except Exception as e:  # a torch.compile toolchain that fails at the first step: its one line
            bad = compile_failure_in(e)
            if bad is None:
                raise
            raise bad from None
        summary["path"] = run_dir
        summary["checkpoint"] = session.checkpoints[-1] if session.checkpoints else resume_from
    else:
        ensure_ray()
        trainer = build_trainer(
            cfg,
            name=name,
            storage_path=storage_path,
            max_failures=max_failures,
            callbacks=callbacks,
            log_level=log_level,
        )
        try:
            result = trainer.fit()
        except Exception as e:  # a bad latent file, failing compiler, unsafe checkpoint met by a worker: one line
            # (GpuShareError: a packed trial's worker out of its share of the GPU's memory)
            bad = (
                dataset_error_in(e) or compile_failure_in(e) or exception_in_chain(e, (UnsafeCheckpoint, GpuShareError))
            )
            if bad is None:
                raise
            raise ConfigError(str(bad)) from None
        summary = dict(result.return_value or {})
        summary["path"] = result.path
        summary["checkpoint"] = result.checkpoint.path if result.checkpoint else None
    if note:
        summary["note"] = note
    return summary
