"""A sweep run the one way, for ``bcrit sweep`` and the Python API (orchestrator.sweep.sweep): the spec to run or
resume (a YAML, its directory, or its storage URI; a URI probed and ``<URI>/bcrit/`` pulled first, so that a sweep
begun on another machine is found and resumed), `orchestrator.execution.launch.prepare`, the Tuner built or restored,
its fit, and the last push of bcrit's files to the URI, also after Ctrl-C or a failure."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UserError
from orchestrator.execution import tuner as tune_setup  # by module: a test's tripwire on build_tuner holds
from orchestrator.execution.launch import Launch, mirror_at_end, prepare
from orchestrator.execution.sweep_state import restore_spec
from orchestrator.features.adaptive.adaptive_resume import resume_spec
from orchestrator.specs.resume_rules import Request, spec_to_run
from orchestrator.specs.sweep_spec import SweepSpec, load_spec
from orchestrator.storage.uri import Mirror, explain, fetch, is_uri, probe


@dataclass(frozen=True)
class SweepRun:
    """A sweep that ran: its spec, Tune's ``ResultGrid``, the seconds from the Tuner's start to the fit's end, and
    its `Launch` (the validated trial configs; whether Tune restored it)."""

    spec: SweepSpec
    results: Any
    wall_s: float
    launch: Launch


def open_spec(path: str, overrides: list[str] | None = None, resume: bool = False) -> SweepSpec:
    """The spec of ``bcrit sweep PATH [--set ...] [--resume]``: a YAML (with a URI storage, what its ``<URI>/bcrit/``
    holds pulled first: `load_and_fetch`), a sweep directory or a storage URI (only with ``resume``), an adaptive
    sweep resumed with a new goal or budget (orchestrator.features.adaptive.adaptive_resume); the rules of
    orchestrator.specs.resume_rules.spec_to_run. Raises UserError."""
    if is_uri(path):  # `bcrit sweep --resume s3://...`: the sweep's files fetched into its local directory
        if not resume:
            raise UserError(f"{path} is a storage URI; pass a spec YAML, or --resume to continue its sweep")
        probe(path)
        path = fetch(path)
    request = Request(path, list(overrides or []), resume)
    spec = resume_spec(request, load_spec, restore_spec)  # an adaptive sweep resumed with a new goal or budget
    return spec or spec_to_run(request, load_and_fetch, restore_spec, what="sweep", command="sweep")


def load_and_fetch(path: str, overrides: list[str] | None) -> SweepSpec:
    """The spec YAML; with a URI storage, `fetch_sweep` first (a sweep started on another machine is then found)."""
    spec = load_spec(path, overrides)
    fetch_sweep(spec)
    return spec


def fetch_sweep(spec: SweepSpec) -> None:
    """With a URI storage, the URI probed (one line if unusable) and what ``<URI>/bcrit/`` holds pulled into the
    spec's local directory (nothing for a directory storage)."""
    if not spec.storage_uri:
        return
    probe(spec.storage_uri)
    try:
        Mirror(spec.storage_uri, spec.sweep_dir).pull()
    except OSError as e:
        raise UserError(explain(spec.storage_uri, e)) from None


def run_sweep(
    spec: SweepSpec,
    resume: bool = False,
    verbose: bool = False,
    *,
    announce: Callable[[SweepSpec, Launch], None] | None = None,
    extra_callbacks: list | tuple = (),
) -> SweepRun:
    """Launch (`prepare`: Ray acquired, every trial checked, the directory's state decided), then ``announce(spec,
    launch)`` (the CLI's lines), the Tuner built (``extra_callbacks`` after bcrit's) or restored (with the callbacks
    it started with), and its fit; a URI sweep's files pushed to ``<URI>/bcrit/`` at the end whatever happens
    (`mirror_at_end`)."""
    launch = prepare(spec, resume, verbose)
    if announce is not None:
        announce(spec, launch)
    t0 = time.perf_counter()
    if launch.restore:
        tuner = tune_setup.restore_tuner(spec, verbose=verbose)
    else:
        tuner = tune_setup.build_tuner(spec, configs=launch.configs, extra_callbacks=extra_callbacks, verbose=verbose)
    try:
        results = tune_setup.run(tuner, spec)
    finally:
        mirror_at_end(spec)
    return SweepRun(spec, results, time.perf_counter() - t0, launch)
