"""Which spec a run or a resume starts from, by ``--set``/``--resume``'s rules, for sweeps and branched studies alike:
a directory only with ``--resume`` and without ``--set``; a YAML, which with ``--resume`` must equal the spec its
storage directory was started with."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from orchestrator.errors import UserError


@dataclass(frozen=True)
class Request:
    """What a run was asked for, as ``bcrit sweep``'s arguments hold it: ``spec`` (a YAML, or a directory to
    resume), ``set`` (the ``--set KEY=VALUE`` overrides), ``resume``."""

    spec: str
    set: list[str] = field(default_factory=list)
    resume: bool = False


def spec_to_run(args, load, restore, *, what: str, command: str, started=None):
    """The spec ``bcrit <command> SPEC|DIR [--set ...] [--resume]`` runs (``args``: a `Request` or the command's
    parsed arguments): a directory only with ``--resume`` and without ``--set`` (``restore(dir)``: the spec it was
    started with); a YAML (``load(path, overrides)``), which with ``--resume`` must equal the spec its storage
    directory was started with. ``started(dir)``: whether that directory holds a started run to compare against
    (default: always -- ``restore`` then says why not). ``what``: "sweep" or "study", for the messages."""
    if os.path.isdir(args.spec):
        if not args.resume:
            raise UserError(f"{args.spec} is a directory; pass a spec YAML, or --resume to continue that {what}")
        if args.set:
            raise UserError(f"--set cannot change a {what} being resumed; start a new {what} instead")
        return restore(args.spec)
    spec = load(args.spec, args.set)
    if not args.resume or (started is not None and not started(spec.sweep_dir)):
        return spec
    saved = restore(spec.sweep_dir)
    if saved.to_yaml() != spec.to_yaml():
        raise UserError(
            f"{args.spec} differs from the spec {spec.sweep_dir} was started with; resume it with "
            f"`bcrit {command} {spec.storage_uri or spec.sweep_dir} --resume`, or start the new "
            "spec in another storage directory"
        )
    return saved
