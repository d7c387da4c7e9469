"""The one registry of workloads: what a sweep, a branched study and a Tune trial need to know about each.

A spec's ``workload`` is a name of `BUILTIN` (``dit``, ``quadratic``) or ``module:attr`` naming a `Workload`
object in a module of your own (the way Ray Serve and uvicorn name an application): it is imported from the
current directory or the Python path, in the driver when the spec is checked and again in every Ray worker that
runs a trial, so it must be importable there too (a local Ray puts the driver's current directory on its workers'
path; a cluster needs it installed or shipped in the job's ``runtime_env``). `get_workload` resolves both, and
refuses anything else in one `ConfigError` line naming the known workloads; nothing falls back to the DiT.

A workload is its config class (a subclass of `trainables.config.BaseConfig`), its ``train_loop(cfg, session)``
(`trainables.skeleton`), a pre-launch check against the resources, and what a branched study does differently for it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainables.config import ConfigError


def _no_check(cfg: Any, resources: dict | None) -> None:
    """The pre-launch check of a workload that needs nothing beyond its config's own validation."""


@dataclass(frozen=True)
class Workload:
    """What a sweep can train.

    ``config_cls``: its trial config (``from_dict`` / ``to_dict``; a `trainables.config.BaseConfig`). ``loop``:
    ``train_loop(cfg, session) -> summary``, in-process and in every Ray Train worker. ``check(cfg, resources)``:
    raises `ConfigError` for what can be known before launch (a missing dataset, more GPUs than the cluster has).
    A branched study: ``noise_key`` is the config key set to B0 in the reference and every branch (common random
    numbers across batch sizes: the NQM's ``noise_unit``), ``branch_keys`` the keys every branch gets (the DiT: no
    warm-up, the reference's is behind it), ``check_kept(path)`` refuses a kept checkpoint before anything runs (the
    DiT: one that does not load as data). The default lr rule across batch sizes is the config's
    ``schedule_lr_rule`` default (`lr_rule`). ``eval_bins(cfg)``: how many per-timestep-bin eval losses
    (``eval/loss/bin{k}``) a trial of ``cfg`` reports, 0 for none (None: the workload does not say; an adaptive
    sweep's ``goal.bins: true`` needs a count >= 2)."""

    name: str
    config_cls: type
    loop: Callable[[Any, Any], dict]
    check: Callable[[Any, dict | None], None] = _no_check
    noise_key: str | None = None
    branch_keys: dict[str, Any] = field(default_factory=dict)
    check_kept: Callable[[str], None] | None = None
    eval_bins: Callable[[Any], int] | None = None

    @property
    def lr_rule(self) -> str:
        """How the lr follows the batch size by default (sqrt for Adam, linear for SGD): the config's default."""
        return {f.name: f.default for f in dataclasses.fields(self.config_cls)}["schedule_lr_rule"]

    @property
    def train_func(self) -> Callable[[dict], Any]:
        """The Ray Train per-worker function taking ``{"trial": cfg_dict}`` (trainables.trial.train_func)."""
        from trainables.trial import train_func

        return functools.partial(train_func, config_cls=self.config_cls, loop=self.loop)


def _dit_kept_loads_as_data(path: str) -> None:
    """A kept DiT checkpoint a branch starts from loads as data (trainables.checkpoint.read): a state holding Python
    objects is refused before Ray starts rather than in every branch trial."""
    from trainables.checkpoint import STATE_FILE, UnsafeCheckpoint, read

    state = os.path.join(path, STATE_FILE)
    if os.path.isfile(state):
        try:
            read(state, mmap=True)
        except UnsafeCheckpoint as e:
            raise ConfigError(str(e)) from None


def _dit_eval_bins(cfg: Any) -> int:
    """The DiT evaluates its held-out loss in every one of ``timestep_bins`` bins (trainables.loop)."""
    return int(cfg.timestep_bins)


def _no_eval_bins(cfg: Any) -> int:
    """The quadratic model's bins share one loss: it reports no per-bin eval loss (trainables.nqm_trial)."""
    return 0


def _dit() -> Workload:
    from trainables.config import TrialConfig
    from trainables.loop import train_loop
    from trainables.trial import check_trial

    return Workload(
        "dit",
        TrialConfig,
        train_loop,
        check_trial,
        branch_keys={"warmup_steps": 0},
        check_kept=_dit_kept_loads_as_data,
        eval_bins=_dit_eval_bins,
    )


def _quadratic() -> Workload:
    from trainables import nqm_trial as q

    return Workload(
        "quadratic", q.QuadraticConfig, q.train_loop, q.check_quadratic, noise_key="noise_unit", eval_bins=_no_eval_bins
    )


# name -> its factory (imports are inside: the DiT's loads torch and diffusers, a spec check needs only the names)
BUILTIN: dict[str, Callable[[], Workload]] = {"dit": _dit, "quadratic": _quadratic}


def known(name: Any) -> bool:
    """Whether ``name`` can name a workload: a key of `BUILTIN` or ``module:attr`` (resolved by `get_workload`)."""
    return isinstance(name, str) and (name in BUILTIN or _is_import_path(name))


def _is_import_path(name: str) -> bool:
    module, sep, attr = name.partition(":")
    return bool(sep) and all(p.isidentifier() for p in module.split(".")) and attr.isidentifier()


def unknown_message(name: Any) -> str:
    return (
        f"workload {name!r} is unknown; choose one of {list(BUILTIN)}, or name your own as module:attr "
        "(a trainables.workloads.Workload; docs/architecture.md)"
    )


def get_workload(name: str) -> Workload:
    """The workload ``name`` names (a key of `BUILTIN`, or ``module:attr``); one ConfigError line otherwise."""
    if isinstance(name, str) and name in BUILTIN:
        return BUILTIN[name]()
    if not known(name):
        raise ConfigError(unknown_message(name))
    module, _, attr = name.partition(":")
    if os.getcwd() not in sys.path:  # `module:attr` from the current directory, as `serve run` and uvicorn do
        sys.path.append(os.getcwd())
    try:
        w = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"workload {name!r} cannot be imported ({e}); put its module on the Python path") from None
    if not isinstance(w, Workload):
        raise ConfigError(f"workload {name!r} is a {type(w).__name__}, not a trainables.workloads.Workload")
    return w
