"""``bcrit sweep SPEC.yaml [--set key=value ...] [--resume]`` and ``bcrit sweep --resume SWEEP_DIR``."""

from __future__ import annotations

import os

from orchestrator.cli import options


def register(sub) -> None:
    p = options.command(
        sub,
        "sweep",
        "run a critical-batch-size sweep, or continue one",
        "Run the critical-batch-size sweep of a spec YAML, or continue one.",
        [
            "bcrit sweep examples/tiny.yaml                   # the demo: a few minutes on a CPU",
            "bcrit sweep runs/tiny --resume                   # continue it after an interruption",
            "bcrit sweep examples/tiny.yaml --dry-run --set stopping.max_steps=80   # its plan and cost, no run",
        ],
    )
    p.add_argument("spec", metavar="SPEC", help="sweep spec YAML, or with --resume the sweep directory")
    options.overrides(p)
    options.resume(p)
    options.verbose(p)
    options.dry_run(p)
    p.set_defaults(func=run, uses_ray=True)


def run(args) -> int:
    from orchestrator.execution.run_sweep import open_spec, run_sweep

    options.check_dry_run(args)
    if args.dry_run:
        return dry_run(args)

    spec = open_spec(args.spec, args.set, args.resume)
    done = run_sweep(spec, args.resume, getattr(args, "verbose", False), announce=announce)
    errors = sum(1 for r in done.results if r.error is not None)
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


def dry_run(args) -> int:
    """``--dry-run``: the plan and its cost (orchestrator.execution.plan); no trial started, nothing written."""
    from orchestrator.execution.plan import show, sweep_plan, throughput_from
    from orchestrator.specs.sweep_spec import load_spec

    spec = load_spec(args.spec, args.set)
    tp = throughput_from(args.throughput_from, spec.raw) if args.throughput_from else None
    print("\n".join(show(sweep_plan(spec), tp)))
    return 0


def announce(spec, launch) -> None:
    """The sweep's opening lines, once it is launched (before the Tuner is built)."""
    count = f"at most {spec.num_trials()}" if spec.search == "adaptive" else str(spec.num_trials())
    print(
        f"[bcrit] sweep {spec.name!r}: {count} trials over batch sizes {list(spec.batch_sizes)} "
        f"({spec.search} search), workload {spec.workload}"
    )
    if spec.storage_uri:
        print(f"[bcrit] storage {spec.storage_uri}: Ray's trials there; bcrit's files mirrored to its bcrit/")
    print(f"[bcrit] sweep dir {spec.sweep_dir}\n[bcrit] MLflow {spec.mlflow_uri} (experiment {spec.experiment!r})")
    note = gns_note(launch.configs)
    if note:
        print(note)


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
