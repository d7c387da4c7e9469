"""A branched study run whole in this process (no Ray, no MLflow), for tests of what ``bcrit branch`` writes and
``bcrit analyze`` answers. Test helper, not a test module: the reference, then every branch, through the workload's
own loop with an in-process session, rows and trials written with the study's own writer and settings
(orchestrator.features.branched.branch_study), as the Tune trials would write them."""

from __future__ import annotations

from orchestrator.features.branched.branch_study import _external_reference, _save_study
from orchestrator.records.runs_tables import RunsTables, trial_row
from orchestrator.specs.branch_spec import BranchSpec, check_branch_spec
from trainables.skeleton import LocalSession
from trainables.workloads import get_workload


def run_inprocess(spec: BranchSpec) -> str:
    """Run the whole study in this process (every trial with ``num_workers: 0``): rows into ``trials.parquet`` /
    ``metrics.parquet`` of the study dir. Returns the study dir."""
    ref_cfg, _ = check_branch_spec(spec)
    assert not (ref_cfg["num_workers"] or spec.ref_split.num_workers or spec.scale_by == "num_workers"), (
        "run_inprocess runs in-process trials only (num_workers: 0)"
    )
    w = get_workload(spec.workload)
    tables = RunsTables(spec.sweep_dir)
    ref_id = _external_reference(spec, ref_cfg) if spec.checkpoints else "reference"
    jobs = [] if spec.checkpoints else [(ref_id, ref_cfg)]
    jobs += [
        (f"b{p}-k{k:g}-s{s}", cfg) for (p, k, s), cfg in zip(spec.branches(), spec.branch_configs(ref_id), strict=True)
    ]
    for tid, cfg in jobs:
        session = LocalSession()  # its rows written once, at the end of the trial (few part files)
        summary = w.loop(w.config_cls.from_dict(cfg), session)
        tables.add_rows(tid, [row for r in session.reports for row in r.get("rows") or []])
        tables.write_trial(trial_row(tid, cfg, summary["status"], session.reports[-1] if session.reports else {}))
    tables.compact()
    _save_study(spec, ref_id)
    return spec.sweep_dir
