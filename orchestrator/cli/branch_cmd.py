"""``bcrit branch SPEC.yaml [--set key=value ...] [--resume]`` and ``bcrit branch --resume STUDY_DIR``: the branched
study (orchestrator.features.branched.branch_study), then ``bcrit analyze STUDY_DIR --out ...`` for the answer."""

from __future__ import annotations

from orchestrator.cli import options


def register(sub) -> None:
    p = options.command(
        sub,
        "branch",
        "B_crit along training from branches of one run",
        "Run a branched study: B_crit along training from branches of one run.",
        [
            "bcrit branch examples/branched-quadratic.yaml",
            "bcrit branch runs/branched-quadratic --resume    # continue it after an interruption",
            "bcrit branch examples/branched-tiny.yaml --dry-run   # its plan: reference, branches, steps, examples",
        ],
    )
    p.add_argument(
        "spec", metavar="SPEC", help="branched-study spec YAML (kind: branched), or with --resume the study directory"
    )
    options.overrides(p)
    options.resume(p)
    options.verbose(p)
    options.dry_run(p)
    p.set_defaults(func=run, uses_ray=True)


def run(args) -> int:
    import time

    from orchestrator.features.branched.branch_study import run_study, started
    from orchestrator.specs.branch_spec import load_branch_spec
    from orchestrator.specs.resume_rules import spec_to_run

    options.check_dry_run(args)
    if args.dry_run:
        return dry_run(args)
    # a YAML resumed where no study started runs from the YAML; a directory that holds one is refused without
    # --resume (branch_study.plan_study, before Ray starts)
    spec = spec_to_run(args, load_branch_spec, _saved_spec, what="study", command="branch", started=started)
    t0 = time.perf_counter()
    print(f"[bcrit] study dir {spec.sweep_dir}\n[bcrit] MLflow {spec.mlflow_uri} (experiment {spec.experiment!r})")
    ref_id, results = run_study(spec, resume=args.resume, verbose=args.verbose)
    errors = sum(1 for r in results if r.error is not None)
    wall = time.perf_counter() - t0
    print(f"[bcrit] done: reference {ref_id}, {len(results)} branches ({errors} failed) in {wall:.0f}s")
    print(f"[bcrit] answer: bcrit analyze {spec.sweep_dir} --out {spec.sweep_dir}/analysis")
    return 0


def dry_run(args) -> int:
    """``--dry-run``: the study's plan (orchestrator.execution.plan); no trial started, nothing written."""
    from orchestrator.execution.plan import branch_plan, show, throughput_from
    from orchestrator.specs.branch_spec import load_branch_spec

    spec = load_branch_spec(args.spec, args.set)
    tp = throughput_from(args.throughput_from, _as_sweep_raw(spec)) if args.throughput_from else None
    print("\n".join(show(branch_plan(spec), tp)))
    return 0


def _as_sweep_raw(spec) -> dict:
    """The keys a throughput is matched on (orchestrator.execution.plan.SAME), from a branched study's spec."""
    return {"workload": spec.workload, "fixed": dict(spec.fixed), "scientific": {"use_gpu": spec.use_gpu}}


def _saved_spec(study_dir: str):
    """The spec a study directory was started with (what ``--resume`` continues)."""
    from orchestrator.execution.sweep_state import restore_spec
    from orchestrator.specs.branch_spec import STUDY_FILE, parse_branch_spec

    return restore_spec(study_dir, STUDY_FILE, parse_branch_spec, "branched study")  # as a sweep's
