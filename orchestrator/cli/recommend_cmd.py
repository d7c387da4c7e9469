"""``bcrit recommend``: the fastest and the cheapest split ``micro x A x W`` to reach a target loss.

``bcrit recommend SWEEP_DIR [--target LOSS] [--metric eval/loss] [--device-mem-gb D] [--gpus-per-worker G]
[--max-workers W] [--max-accum A] [--max-batch B] [--bootstrap N] [--seed S] [--no-mlflow] [--out DIR]`` (default
``SWEEP_DIR/analysis``); ``--mlflow-experiment NAME [--tracking-uri URI] [--parent-run-id ID] --out DIR`` instead of
SWEEP_DIR reads the sweep from MLflow, as ``bcrit analyze`` does. Without ``--target``: the target ``bcrit analyze``
quotes (``bcrit.json``'s answer), else
the lowest trustworthy automatic target. Writes ``recommend.json``, ``recommend.png`` and ``recommend.md``, puts the
same section into ``report.md``/``report.html`` when they exist, and logs them to the sweep's MLflow parent run.
The science is in :mod:`analysis.features.recommend.recommend` (docs/recommend.md). User mistakes: one line, exit status
2.
"""

from __future__ import annotations

import argparse
import json
import math
import os

from analysis.core.device_share import share_error
from orchestrator.cli import inputs, options
from orchestrator.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.mlflow_source(p)
    options.target(p)
    options.metric(p)
    p.add_argument(
        "--device-mem-gb",
        type=float,
        metavar="GIB",
        help="memory of one device (GiB): splits predicted above it are excluded",
    )
    p.add_argument(
        "--gpus-per-worker",
        type=float,
        default=1.0,
        metavar="SHARE",
        help="share of one device a worker holds (scientific.gpus_per_worker, (0, 1]): with --device-mem-gb, splits "
        "predicted above that share of it are excluded, and packed trials run one worker (default: 1)",
    )
    p.add_argument(
        "--max-workers", type=int, metavar="W", help="largest number of workers to consider (default: largest measured)"
    )
    p.add_argument(
        "--max-accum", type=int, metavar="A", help="largest accumulation to consider (default: largest measured)"
    )
    p.add_argument(
        "--max-batch", type=int, metavar="B", help="largest batch size (default: largest fitted; above is extrapolated)"
    )
    options.bootstrap(p)
    options.seed(p)
    options.no_mlflow(p)
    options.out(p)


def register(subparsers) -> argparse.ArgumentParser:
    p = options.command(
        subparsers,
        "recommend",
        "the fastest and cheapest way to a target loss",
        "The fastest and the cheapest split (micro x A x W) to reach a target loss.",
        [
            "bcrit recommend runs/tiny                        # at the target bcrit analyze quotes",
            "bcrit recommend runs/tiny-splits --target 0.2",
            "bcrit recommend runs/tiny --device-mem-gb 80 --gpus-per-worker 0.25 --max-workers 8",
        ],
    )
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    return _run(args)


def check_args(args: argparse.Namespace) -> None:
    """Every flag's value, before any compute."""
    if args.target is not None and not math.isfinite(args.target):
        raise UserError(f"--target must be a finite loss, got {args.target}")
    if args.device_mem_gb is not None and not (math.isfinite(args.device_mem_gb) and args.device_mem_gb > 0):
        raise UserError(f"--device-mem-gb must be a positive number of GiB, got {args.device_mem_gb}")
    if why := share_error("--gpus-per-worker", args.gpus_per_worker):
        raise UserError(why)
    for flag in ("max_workers", "max_accum", "max_batch"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be an integer >= 1, got {v}")
    if args.bootstrap < 1:
        raise UserError(f"--bootstrap must be >= 1 (the intervals need replicates), got {args.bootstrap}")
    options.check_seed(args.seed)


def cost_unit(sweep_dir: str) -> str:
    """``GPU-hours`` / ``CPU-worker-hours`` from the sweep's spec (``scientific.use_gpu``), else ``device-hours``."""
    from orchestrator.storage.layout import SPEC_FILE  # not at the top: it loads numpy and pyarrow (bcrit --help)

    path = os.path.join(sweep_dir, SPEC_FILE)
    try:
        from orchestrator.specs.yaml_overrides import load_yaml

        spec = load_yaml(path)
        use_gpu = (spec.get("scientific") or {}).get("use_gpu")
    except (OSError, ValueError, AttributeError):
        return "device-hours"
    return "device-hours" if use_gpu is None else ("GPU-hours" if use_gpu else "CPU-worker-hours")


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from analysis.features.recommend import recommend, throughput
    from analysis.features.recommend import recommend_report as rr
    from analysis.reporting.trust_note import flags_at, untrusted_line
    from analysis.sources import loaders
    from orchestrator.cli.analyze_cmd import UsageError, check_metric, check_out_dir, check_own_store, check_parent_run

    check_args(args)
    runs = inputs.load_runs(args)
    out = args.out
    check_out_dir(out)
    parent = None if args.no_mlflow else runs.parent_run_id
    if parent and args.sweep_dir:
        check_own_store(args.sweep_dir, runs.tracking_uri)
    source = f"{args.sweep_dir}/{loaders.SWEEP_PARENT_FILE}" if args.sweep_dir else "--mlflow-experiment"
    uri = check_parent_run(runs.tracking_uri, parent, source) if parent else None
    if args.metric not in runs.metric_names():
        raise UserError(f"--metric {args.metric}: no trial reported it (have {runs.metric_names()[:6]} ...)")
    try:
        check_metric(runs, args.metric, None if args.target is None else [args.target])
    except UsageError as e:  # analyze's wording names its --targets; this command's flag is --target
        raise UserError(
            str(e)
            .replace("--targets", "--target")
            .replace("omit --target for automatic ones", "omit --target for the headline one")
        ) from None
    throughput.measured_splits(runs)  # a sweep without sys/ metrics: say so before the fit
    target, how = (
        (args.target, "--target") if args.target is not None else inputs.default_target(runs, args.metric, out)
    )
    if args.max_batch is not None and args.max_batch < int(runs.batch_size.min()):
        raise UserError(
            f"--max-batch {args.max_batch}: no candidate split has a batch size <= {args.max_batch}; raise it"
        )
    p, fit, times = recommend.recommend(
        runs, target, args.metric, unit=cost_unit(args.sweep_dir or out), device_mem_gb=args.device_mem_gb,
        gpus_per_worker=args.gpus_per_worker, max_workers=args.max_workers, max_accum=args.max_accum,
        max_batch=args.max_batch, n_boot=args.bootstrap, seed=args.seed,
    )  # fmt: skip
    pollux = pollux_lines(runs, args.metric, fit, p)
    model = throughput.fit_step_time(times.splits, times.step_s)
    flags = flags_at(runs, args.metric, target)
    warning = untrusted_line({float(target): flags}, "this recommendation")
    rec = rr.to_json(p, {"target_from": how, "throughput_model": model_json(model, times), "pollux": pollux[1],
                         "flags": flags, "warning": warning})  # fmt: skip
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, rr.JSON_FILE), "w", encoding="utf-8") as f:
        f.write(json.dumps(rec, indent=1, allow_nan=False) + "\n")
    rr.figure(p, Path(out))
    sec = rr.section(p, model_lines(model, times), pollux[0], warning)
    write_section(out, sec, args.metric)
    if parent:
        from analysis.reporting.publish import log_recommendation

        log_recommendation(out, uri, parent, rec)
    if warning:
        print(warning)
    print(f"target: {args.metric} {target:.4g} ({how})")
    print("\n".join(rr.summary(p)))
    print("\n".join(rr.table(p)))
    print(model_lines(model, times)[0].replace("`", "").rstrip(":") + "; per split in recommend.md")
    excluded = sorted({e for e in p.excluded if e})
    print("\n".join(pollux[0] + [f"- excluded: {e}" for e in excluded] + [f"- {n}" for n in p.notes]))
    print(schedule_line(args.sweep_dir or os.path.join(out, "bcrit.json")))
    print(
        f"wrote {out}/{rr.JSON_FILE}, {rr.FIGURE}, recommend.md"
        + (f"; logged to MLflow run {parent}" if parent else "")
    )
    return 0


def model_json(model, times) -> dict:
    from analysis.features.recommend.throughput import FEATURES

    return {
        "coef": dict(zip(FEATURES, [float(c) for c in model.coef], strict=True)),
        "rank": model.rank,
        "rms_log": model.rms_log,
        "splits": [{"split": [int(x) for x in s], "step_s": float(t), "residual_log": float(r), "trials": int(n)}
                   for s, t, r, n in zip(times.splits, times.step_s, model.residual_log, times.n_trials, strict=True)],
    }  # fmt: skip


def model_lines(model, times) -> list[str]:
    """The throughput model's fit and residuals, for the report."""
    from analysis.features.recommend.recommend_report import split_name

    g, a, b, k = model.coef
    lines = [
        f"Step time model `T = γ + A·(α + β·micro) + κ·2(W-1)/W`: γ = {1000 * g:.3g} ms, α = {1000 * a:.3g} ms, "
        f"β = {1000 * b:.3g} ms/example, κ = {1000 * k:.3g} ms (rank {model.rank} of 4; rms log residual "
        f"{model.rms_log:.3g}):",
        "",
        "| split | trials | measured ms/step | model ms/step | residual (log) |",
        "|:---:|---:|---:|---:|---:|",
    ]
    fitted = model.predict(times.splits)
    for s, n, t, f, r in zip(times.splits, times.n_trials, times.step_s, fitted, model.residual_log, strict=True):
        lines.append(f"| {split_name(s)} | {n} | {1000 * t:.4g} | {1000 * f:.4g} | {r:+.3f} |")
    return lines


def pollux_lines(runs, metric: str, fit, p) -> tuple[list[str], dict | None]:
    """Pollux's goodput optimum from the same sweep's B_simple, beside the recommendation."""
    from analysis.features.recommend import recommend
    from analysis.features.recommend.recommend_report import split_name

    bs = recommend.b_simple_at_target(runs, metric, fit.target)
    if bs is None:
        return ["- Pollux comparison: no B_simple logged at this target (gns/ metrics missing)"], None
    j = recommend.pollux_choice(p, bs)
    t_pollux = recommend.pollux_times(fit, bs, p.batch_size[[j]], p.step_s[[j]])[0]
    same = j == p.fastest
    line = (
        f"- Pollux (goodput with φ = B_simple = {bs:.3g} at this target, vs B_crit = {fit.e_min / fit.s_min:.3g}) "
        "picks "
        f"{split_name(p.splits[j])}: " + ("the same as the fastest." if same else
        f"its predicted time here {p.time_s[j]:.3g} s (Pollux's own model says {t_pollux:.3g} s) vs the fastest's "
        f"{p.time_s[p.fastest]:.3g} s.")
    )  # fmt: skip
    return [line], {"b_simple": bs, "choice": j, "same_as_fastest": bool(same), "pollux_model_time_s": float(t_pollux)}


def write_section(out: str, sec: str, metric: str) -> None:
    """``recommend.md``, and the section in ``report.md`` (``report.html`` re-rendered) when a report exists."""
    from analysis.features.recommend.recommend_report import replace_section
    from analysis.reporting.html_report import HTML_FILE, render_html
    from analysis.reporting.report import REPORT_FILE

    with open(os.path.join(out, "recommend.md"), "w", encoding="utf-8") as f:
        f.write(sec)
    path = os.path.join(out, REPORT_FILE)
    if os.path.isfile(path):
        md = replace_section(open(path, encoding="utf-8").read(), sec)
        with open(path, "w", encoding="utf-8") as f:
            f.write(md)
        with open(os.path.join(out, HTML_FILE), "w", encoding="utf-8") as f:
            f.write(render_html(md, out, title=f"Critical batch size: {metric}"))


def schedule_line(sweep_dir: str) -> str:
    """One line on growing the batch during training: the step-minimising ``batch_schedule`` within the examples of
    the constant batch size nearest B_crit (``bcrit schedule``, analysis.features.schedule.schedule), from the sweep's
    analysis."""
    from analysis.features.schedule.schedule import propose, segments_of
    from orchestrator.features.schedule import schedule_plan as sc

    try:
        path, _ = sc.analysis_file(sweep_dir)
        with open(path) as f:
            result = json.load(f)
        segments, _notes = segments_of(result)
        if not segments:
            return "batch schedule: no target has a usable fit to propose one from"
        proposal = propose(segments, sc.batch_sizes_of(None, result), None)
        out = sc.summary(proposal, sc.tuned_lrs(result, segments), sc.throughput_per_batch(sweep_dir), [])
    except (UserError, OSError, ValueError, KeyError) as e:
        return f"batch schedule: not proposed ({e})"
    sched, ref = out["schedule"], out["reference"]
    if len(set(sched["sizes"])) == 1:
        return (f"batch schedule: none proposed -- no growing batch beats {ref['plan']} within its examples "
                f"(bcrit schedule {sweep_dir} shows the segments)")  # fmt: skip
    t = out["trial"]
    return (
        f"batch schedule: start at batch_size {t['batch_size']}, batch_schedule {t['batch_schedule']}: predicted "
        f"{100 * (1 - sched['steps'] / ref['steps']):.0f}% fewer steps and "
        f"{100 * (1 - sched['examples'] / ref['examples']):.0f}% fewer examples than {ref['plan']} "
        f"(bcrit schedule {sweep_dir}; docs/schedule.md)"
    )
