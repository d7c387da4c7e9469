"""``bcrit branch SPEC.yaml [--set key=value ...] [--resume]`` and ``bcrit branch --resume STUDY_DIR``: the branched
study (orchestrator.branch), then ``bcrit analyze STUDY_DIR --out ...`` for the answer."""

from __future__ import annotations

import os


def register(sub) -> None:
    p = sub.add_parser(
        "branch",
        help="critical batch size during training from branches of one run (Merrill et al. 2025)",
        description="Run a branched study (see examples/branched-quadratic.yaml), or continue an interrupted one.",
    )
    p.add_argument("spec", help="branched-study spec YAML (kind: branched), or with --resume the study directory")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec key (dotted)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted study")
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    import yaml

    from orchestrator.branch import run_study
    from orchestrator.branch_spec import STUDY_FILE, load_branch_spec, parse_branch_spec
    from orchestrator.overrides import UserError

    if os.path.isdir(args.spec):
        if not args.resume:
            raise UserError(f"{args.spec} is a directory; pass a spec YAML, or --resume to continue that study")
        path = os.path.join(args.spec, STUDY_FILE)
        if not os.path.exists(path):
            raise UserError(f"{args.spec}: not a branched study directory (no {STUDY_FILE})")
        with open(path) as f:
            spec = parse_branch_spec(yaml.safe_load(f), sweep_dir=args.spec, source=path)
    else:
        spec = load_branch_spec(args.spec, args.set)
        saved = os.path.join(spec.sweep_dir, STUDY_FILE)
        if os.path.exists(saved) and not args.resume:
            raise UserError(
                f"{spec.sweep_dir} already holds a branched study; add --resume to continue it, or set storage to a "
                "new directory"
            )
    t0 = time.perf_counter()
    print(f"[bcrit] study dir {spec.sweep_dir}\n[bcrit] MLflow {spec.mlflow_uri} (experiment {spec.experiment!r})")
    ref_id, results = run_study(spec, resume=args.resume)
    errors = sum(1 for r in results if r.error is not None)
    wall = time.perf_counter() - t0
    print(f"[bcrit] done: reference {ref_id}, {len(results)} branches ({errors} failed) in {wall:.0f}s")
    print(f"[bcrit] answer: bcrit analyze {spec.sweep_dir} --out {spec.sweep_dir}/analysis")
    return 0
