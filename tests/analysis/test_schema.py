"""The runs-table contract: every bad-input case gives a RunsTableError naming the file and column."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.core import metrics as m
from analysis.sources.loaders import load_sweep_dir
from analysis.sources.schema import (
    METRICS_FILE,
    METRICS_SCHEMA,
    TRIALS_FILE,
    TRIALS_SCHEMA,
    RunsTableError,
    metrics_table,
    trials_table,
    validate_metrics,
    validate_trials,
)


def _trials(**over):
    cols = {
        "trial_id": ["a", "b"],
        "batch_size": [8, 16],
        "micro_batch_size": [8, 8],
        "grad_accum": [1, 2],
        "num_workers": [1, 1],
        "lr": [0.1, 0.2],
        "seed": [0, 0],
        "status": [m.STATUS_REACHED_TARGET, m.STATUS_DIVERGED],
    }
    cols.update(over)
    return cols


def _metrics(**over):
    cols = {
        "trial_id": ["a", "a", "b"],
        "step": [0, 10, 0],
        "examples": [0, 80, 0],
        "metric": [m.EVAL_LOSS] * 3,
        "value": [1.0, 0.5, 1.0],
    }
    cols.update(over)
    return cols


def test_good_tables_pass_and_keep_extra_columns():
    t = trials_table({**_trials(), "warmup": [10, 20]})
    assert t.schema.field("warmup").type == pa.int64()
    assert t.schema.field("batch_size").type == pa.int64()
    validate_metrics(metrics_table(_metrics()), trial_ids=t.column("trial_id"))
    validate_metrics(metrics_table({**_metrics(), "wall_time": [0.0, 1.0, 0.0]}))


@pytest.mark.parametrize("col", TRIALS_SCHEMA.names)
def test_trials_missing_column(col):
    t = pa.table(_trials()).cast(TRIALS_SCHEMA).drop_columns([col])
    with pytest.raises(RunsTableError, match=rf"{TRIALS_FILE}: missing column '{col}'"):
        validate_trials(t)


@pytest.mark.parametrize("col", METRICS_SCHEMA.names)
def test_metrics_missing_column(col):
    t = metrics_table(_metrics()).drop_columns([col])
    with pytest.raises(RunsTableError, match=rf"{METRICS_FILE}: missing column '{col}'"):
        validate_metrics(t)


def test_wrong_types():
    t = pa.table(_trials()).cast(TRIALS_SCHEMA)
    bad = t.set_column(1, "batch_size", pa.array([8.0, 16.0]))
    with pytest.raises(RunsTableError, match="column 'batch_size' has type double, expected int64"):
        validate_trials(bad)
    mt = metrics_table(_metrics())
    bad = mt.set_column(4, "value", pa.array([1, 0, 1], pa.int32()))
    with pytest.raises(RunsTableError, match="column 'value' has type int32, expected double"):
        validate_metrics(bad)
    bad = mt.append_column("wall_time", pa.array(["x", "y", "z"]))
    with pytest.raises(RunsTableError, match="column 'wall_time'"):
        validate_metrics(bad)


def test_duplicate_trials_and_bad_status_and_nulls():
    with pytest.raises(RunsTableError, match=r"'trial_id' has duplicates \['a'\]"):
        trials_table(_trials(trial_id=["a", "a"]))
    with pytest.raises(RunsTableError, match="column 'status' has 'done'"):
        trials_table(_trials(status=["done", m.STATUS_FAILED]))
    with pytest.raises(RunsTableError, match="column 'lr' has null"):
        trials_table(_trials(lr=[0.1, None]))
    with pytest.raises(RunsTableError, match="'grad_accum' must be >= 1"):
        trials_table(_trials(grad_accum=[0, 1]))


def test_duplicate_metric_rows_sorted_and_unsorted():
    dup = _metrics(trial_id=["a", "a", "a"], step=[0, 10, 10])
    with pytest.raises(RunsTableError, match=r"duplicate rows .*\('a', 10, 'eval/loss'\)"):
        validate_metrics(metrics_table(dup))
    unsorted = _metrics(trial_id=["a", "b", "a"], step=[10, 0, 10])
    with pytest.raises(RunsTableError, match=r"\('a', 10, 'eval/loss'\)"):
        validate_metrics(metrics_table(unsorted))
    # the same step for two metrics is not a duplicate
    validate_metrics(metrics_table(_metrics(step=[10, 10, 0], metric=[m.EVAL_LOSS, m.TRAIN_LOSS, m.EVAL_LOSS])))


def test_unknown_trial_ids_and_negative_steps():
    t = trials_table(_trials())
    with pytest.raises(RunsTableError, match=r"1 ids not in trials.parquet \(e.g. \['zz'\]\)"):
        validate_metrics(metrics_table(_metrics(trial_id=["a", "zz", "b"])), trial_ids=t.column("trial_id"))
    with pytest.raises(RunsTableError, match="negative"):
        validate_metrics(metrics_table(_metrics(step=[-1, 10, 0])))


def test_load_sweep_dir_errors(tmp_path):
    with pytest.raises(RunsTableError, match="no such sweep directory"):
        load_sweep_dir(tmp_path / "nope")
    with pytest.raises(RunsTableError, match="trials.parquet: missing"):
        load_sweep_dir(tmp_path)
    (tmp_path / TRIALS_FILE).write_text("not parquet")
    pq.write_table(metrics_table(_metrics()), tmp_path / METRICS_FILE)
    with pytest.raises(RunsTableError, match="not a readable Parquet file"):
        load_sweep_dir(tmp_path)
    pq.write_table(pa.table(_trials()), tmp_path / TRIALS_FILE)  # int64 by default, but lr ok, all fine
    runs = load_sweep_dir(tmp_path)
    assert runs.trial_ids == ["a", "b"]
    pq.write_table(pa.table(_trials(seed=[0.5, 1.5])), tmp_path / TRIALS_FILE)
    with pytest.raises(RunsTableError, match="trials.parquet: column 'seed' has type double"):
        load_sweep_dir(tmp_path)
