"""``bcrit sweep SPEC.yaml [--set key=value ...] [--resume]`` and ``bcrit sweep --resume SWEEP_DIR``."""

from __future__ import annotations

import os

from orchestrator.cli import inputs, options


def register(sub) -> None:
    p = options.command(
        sub,
        "sweep",
        "run a critical-batch-size sweep, or continue one",
        "Run the critical-batch-size sweep of a spec YAML, or continue one.",
        [
            "bcrit sweep examples/tiny.yaml                   # the demo: a few minutes on a CPU",
            "bcrit sweep examples/quadratic.yaml --set stopping.max_steps=500 --set nuisance.lr=[0.5,1.2]",
            "bcrit sweep runs/tiny --resume                   # continue it after an interruption",
        ],
    )
    p.add_argument("spec", metavar="SPEC", help="sweep spec YAML, or with --resume the sweep directory")
    options.overrides(p)
    options.resume(p)
    options.verbose(p)
    p.set_defaults(func=run, uses_ray=True)


def run(args) -> int:
    from orchestrator.execution.sweep_state import restore_spec
    from orchestrator.search.adaptive_resume import resume_spec
    from orchestrator.specs.sweep_spec import load_spec
    from orchestrator.storage.uri import fetch, is_uri, probe

    if is_uri(args.spec):  # `bcrit sweep --resume s3://...`: the sweep's files fetched into its local directory
        if not args.resume:
            from orchestrator.errors import UserError

            raise UserError(f"{args.spec} is a storage URI; pass a spec YAML, or --resume to continue its sweep")
        probe(args.spec)
        args.spec = fetch(args.spec)
    spec = resume_spec(args, load_spec, restore_spec)  # an adaptive sweep resumed with a new goal or budget
    spec = spec or inputs.spec_to_run(args, load_and_fetch, restore_spec, what="sweep", command="sweep")
    return _run(spec, args.resume, getattr(args, "verbose", False))


def load_and_fetch(path: str, overrides: list[str] | None):
    """The spec YAML; with a URI storage, the URI probed (one line if unusable) and what ``<URI>/bcrit/`` holds
    fetched into the local directory first (a sweep started on another machine is then found, and resumed)."""
    from orchestrator.specs.sweep_spec import load_spec
    from orchestrator.storage.uri import Mirror, explain, probe

    spec = load_spec(path, overrides)
    if spec.storage_uri:
        probe(spec.storage_uri)
        try:
            Mirror(spec.storage_uri, spec.sweep_dir).pull()
        except OSError as e:
            from orchestrator.errors import UserError

            raise UserError(explain(spec.storage_uri, e)) from None
    return spec


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
    from orchestrator.execution.launch import mirror_at_end, prepare
    from orchestrator.execution.tuner import build_tuner, restore_tuner, run

    launch = prepare(spec, resume, verbose)
    configs, resume = launch.configs, launch.restore
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
