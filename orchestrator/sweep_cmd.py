"""``bcrit sweep SPEC.yaml [--set key=value ...] [--resume]`` and ``bcrit sweep --resume SWEEP_DIR``."""

from __future__ import annotations

import os

from orchestrator import options


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a critical-batch-size sweep (Ray Tune; MLflow; Parquet tables)",
        description="Run the sweep of a spec YAML (see examples/tiny.yaml), or continue an interrupted one.",
    )
    p.add_argument("spec", help="sweep spec YAML, or with --resume the sweep directory")
    options.overrides(p)
    options.resume(p)
    options.verbose(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from orchestrator.adaptive_resume import resume_spec
    from orchestrator.spec import load_spec
    from orchestrator.sweep_state import restore_spec
    from orchestrator.uri_storage import fetch, is_uri, probe

    if is_uri(args.spec):  # `bcrit sweep --resume s3://...`: the sweep's files fetched into its local directory
        if not args.resume:
            from orchestrator.overrides import UserError

            raise UserError(f"{args.spec} is a storage URI; pass a spec YAML, or --resume to continue its sweep")
        probe(args.spec)
        args.spec = fetch(args.spec)
    spec = resume_spec(args, load_spec, restore_spec)  # an adaptive sweep resumed with a new goal or budget
    spec = spec or options.spec_to_run(args, load_and_fetch, restore_spec, what="sweep", command="sweep")
    return _run(spec, args.resume, getattr(args, "verbose", False))


def load_and_fetch(path: str, overrides: list[str] | None):
    """The spec YAML; with a URI storage, the URI probed (one line if unusable) and what ``<URI>/bcrit/`` holds
    fetched into the local directory first (a sweep started on another machine is then found, and resumed)."""
    from orchestrator.spec import load_spec
    from orchestrator.uri_storage import Mirror, explain, probe

    spec = load_spec(path, overrides)
    if spec.storage_uri:
        probe(spec.storage_uri)
        try:
            Mirror(spec.storage_uri, spec.sweep_dir).pull()
        except OSError as e:
            from orchestrator.overrides import UserError

            raise UserError(explain(spec.storage_uri, e)) from None
    return spec


def plan_start(spec, resume: bool) -> bool:
    """Decide, before Ray starts, how the sweep dir is used; returns whether to ``Tuner.restore``. A sweep
    killed before Tune's first state file is started again from scratch (its leftovers cleared); a fresh start
    is refused only for a directory holding a restorable sweep or results of an earlier one."""
    from orchestrator.overrides import UserError
    from orchestrator.sweep_state import (
        NO_SWEEP,
        RESTORABLE,
        UNSTARTED,
        check_resumable_tracking,
        has_results,
        reset_unstarted,
        sweep_state,
    )

    state = sweep_state(spec.sweep_dir, spec.storage_uri)
    if state == RESTORABLE:
        if not resume:
            raise UserError(
                f"{spec.sweep_dir} already holds a sweep; add --resume to continue it, or set storage to a new "
                "directory"
            )
        check_resumable_tracking(spec)
        return True
    if state == UNSTARTED:
        print(
            f"[bcrit] {spec.sweep_dir}: the sweep was stopped before Tune saved its first state; starting it again "
            "from scratch"
        )
        reset_unstarted(spec)
        return False
    assert state == NO_SWEEP
    if has_results(spec.sweep_dir):
        tune = f"{spec.storage_root}/tune" if not spec.storage_uri else spec.storage_uri + " (its tune/)"
        raise UserError(
            f"{spec.sweep_dir} holds results of an earlier sweep but no Tune state ({tune} is gone)"
            ", so it cannot be resumed; start the sweep in a new storage directory"
        )
    if resume:
        raise UserError(f"{spec.sweep_dir}: no interrupted sweep to resume; run it without --resume")
    return False


def gns_note(configs: list[dict]) -> str | None:
    """One line for the trials without global GNS instead of one per trial; None when every trial has it (or GNS
    is off, or the workload is not the DiT's)."""
    from trainables.config import GNS_NONE, global_gns_mode

    def mode(c: dict) -> str:
        world, accum = max(1, int(c.get("num_workers", 0))), int(c.get("grad_accum") or 1)
        return global_gns_mode(bool(c.get("gns", True)), world, accum, int(c["micro_batch_size"]),
                               bool(c.get("gns_halves", True)))  # fmt: skip

    if not configs or "dataset" not in configs[0]:
        return None
    off = [c for c in configs if mode(c) == GNS_NONE]
    if not off:
        return None
    return (
        f"[bcrit] global GNS: unavailable for {len(off)} of {len(configs)} trials (it needs num_workers x grad_accum "
        ">= 2, or gns_halves with micro_batch_size >= 2); their per-bin GNS is unaffected"
    )


def _run(spec, resume: bool, verbose: bool = False) -> int:
    from orchestrator.cluster import connect, on_cluster
    from orchestrator.resources import local_resources, start_ray
    from orchestrator.sweep_checks import check_spec
    from orchestrator.tuner import build_tuner, restore_tuner, run

    # validate before any trial starts: against the local Ray we would start, or (joined first) against what the
    # cluster at RAY_ADDRESS can hold, its autoscaler's node types included
    if on_cluster():
        connect(verbose)
        configs = check_spec(spec)
        resume = plan_start(spec, resume)
    else:
        configs = check_spec(spec, local_resources(spec))
        resume = plan_start(spec, resume)
        start_ray(spec, verbose)
    count = f"at most {spec.num_trials()}" if spec.search == "adaptive" else str(spec.num_trials())
    print(
        f"[bcrit] sweep {spec.name!r}: {count} trials over batch sizes {list(spec.batch_sizes)} "
        f"({spec.search} search), workload {spec.workload}"
    )
    if spec.storage_uri:
        print(f"[bcrit] storage {spec.storage_uri}: Ray's trials there; bcrit's files mirrored to its bcrit/")
    print(f"[bcrit] sweep dir {spec.sweep_dir}\n[bcrit] MLflow {spec.mlflow_uri} (experiment {spec.experiment!r})")
    note = gns_note(configs)
    if note:
        print(note)
    tuner = restore_tuner(spec, verbose=verbose) if resume else build_tuner(spec, configs=configs, verbose=verbose)
    try:
        results = run(tuner, spec)
    finally:
        mirror_at_end(spec)
    errors = sum(1 for r in results if r.error is not None)
    if errors:
        print(f"[bcrit] {errors} trial(s) failed: their errors are in {spec.storage_root}/tune/<trial_id>/error.txt")
    print(f"[bcrit] results: {spec.sweep_dir}/trials.parquet, {spec.sweep_dir}/metrics.parquet")
    source = spec.storage_uri or spec.sweep_dir
    print(f"[bcrit] next: bcrit analyze {source}  (writes {spec.sweep_dir}/analysis)")
    server = spec.mlflow_uri.startswith(("http://", "https://"))
    if not server:
        print(f"[bcrit] browse: mlflow ui --backend-store-uri {spec.mlflow_uri}")
    page = parent_run_page(spec.sweep_dir, spec.mlflow_uri.rstrip("/") if server else "http://127.0.0.1:5000")
    if page:
        print(f"[bcrit] then open {page}")
    return 0


def mirror_at_end(spec) -> None:
    """A URI sweep's last push of its local directory to ``<URI>/bcrit/`` (also after Ctrl-C or a failure)."""
    if not spec.storage_uri:
        return
    from orchestrator.uri_storage import MIRROR, Mirror, join

    try:
        n = Mirror(spec.storage_uri, spec.sweep_dir).push()
    except OSError as e:
        print(f"[bcrit] mirroring {spec.sweep_dir} to {spec.storage_uri} failed: {e}; rerun `bcrit sweep --resume`")
        return
    print(f"[bcrit] mirrored {spec.sweep_dir} -> {join(spec.storage_uri, MIRROR)}/ ({n} files updated)")


def parent_run_page(sweep_dir: str, ui: str = "http://127.0.0.1:5000") -> str | None:
    """The sweep's parent run in the MLflow UI (``mlflow ui``'s default address), in its model-training view
    (``workflowType=machine_learning``: MLflow 3's UI otherwise opens its GenAI view); None without a parent."""
    import json

    from analysis.sources.loaders import SWEEP_PARENT_FILE

    try:
        with open(os.path.join(sweep_dir, SWEEP_PARENT_FILE)) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    if not saved.get("experiment_id") or not saved.get("run_id"):
        return None
    return f"{ui}/#/experiments/{saved['experiment_id']}/runs/{saved['run_id']}?workflowType=machine_learning"
