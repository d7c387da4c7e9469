"""A scheduled trial in the runs tables: the rows' ``examples`` are summed over its stages, and ``trials.parquet``
carries its ``batch_schedule`` (absent for a constant trial's row)."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pyarrow.parquet as pq

from analysis.core import metrics as M
from orchestrator.records.runs_tables import RunsTables, trial_row
from tests.orchestrator.test_quadratic_pipeline import TablesSession
from trainables.nqm_trial import QuadraticConfig, train_loop


def test_scheduled_trial_rows_count_true_examples(tmp_path):
    tables = RunsTables(str(tmp_path))
    base = dict(dim=8, batch_size=4, micro_batch_size=4, lr=0.2, max_steps=12, eval_every=2, report_every=4)
    for tid, schedule in (("const", []), ("sched", [[4, 8], [8, 16]])):
        cfg = QuadraticConfig(**base, batch_schedule=schedule)
        session = TablesSession(tables, tid)
        summary = train_loop(cfg, session)
        tables.write_trial(trial_row(tid, cfg.to_dict(), summary["status"], session.last))
    tables.compact()
    trials = pq.read_table(tmp_path / "trials.parquet").sort_by("trial_id").to_pylist()
    assert [(t["trial_id"], t["batch_schedule"], t[M.EXAMPLES]) for t in trials] == [
        ("const", None, 48.0),
        ("sched", json.dumps([[4, 8], [8, 16]]), 4 * 4 + 4 * 8 + 4 * 16),
    ]
    metrics = pq.read_table(tmp_path / "metrics.parquet")
    rows = metrics.filter(pc.and_(pc.equal(metrics["trial_id"], "sched"), pc.equal(metrics["metric"], M.EVAL_LOSS)))
    got = sorted(zip(rows["step"].to_pylist(), rows["examples"].to_pylist(), strict=True))
    assert got == [(0, 0), (2, 8), (4, 16), (6, 32), (8, 48), (10, 80), (12, 112)]
