"""The runs-table contract: two Parquet files that any training code can write and the analysis reads.

``trials.parquet`` (one row per trial)
    ``trial_id`` string, ``batch_size`` int64 (effective, ``micro x accum x workers``), ``micro_batch_size``,
    ``grad_accum``, ``num_workers`` int64, ``lr`` float64, ``seed`` int64, ``status`` string, one of
    :data:`analysis.core.metrics.FINAL_STATUSES` or ``"running"``. Further hyper-parameter columns are allowed; the
    optional :data:`NUISANCE_COLUMNS` (with ``lr`` and the split) identify a trial's nuisance setting, ``seed``
    its repeat.
``metrics.parquet`` (long format, one row per reported value)
    ``trial_id`` string, ``step`` int64 (optimizer steps), ``examples`` int64, ``metric`` string (names from
    :mod:`analysis.core.metrics`), ``value`` float64; optional ``wall_time`` float64 (seconds since trial start).

Writers should build their tables with :data:`TRIALS_SCHEMA` / :data:`METRICS_SCHEMA` (see :func:`trials_table`,
:func:`metrics_table`) and, for fast loading, write metrics rows sorted by ``(trial_id, step, metric)``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.core import metrics as m
from analysis.core.bcrit_error import BcritError

TRIALS_FILE = "trials.parquet"
METRICS_FILE = "metrics.parquet"
DECISIONS_FILE = "adaptive-decisions.json"  # an adaptive sweep's decisions (analysis.features.adaptive)
BRANCH_SETTINGS_FILE = "branched_study.json"  # written by bcrit branch: the analysis settings of the study
# the extra trials.parquet columns of a branched study, null on its reference's row (analysis.features.branched)
PARENT, BRANCH_STEP, K = "parent_trial_id", "branch_step", "k"
BRANCH_COLUMNS = (PARENT, BRANCH_STEP, K)
STATUSES = (*m.FINAL_STATUSES, m.STATUS_RUNNING)

TRIALS_SCHEMA = pa.schema(
    [
        ("trial_id", pa.string()),
        ("batch_size", pa.int64()),
        ("micro_batch_size", pa.int64()),
        ("grad_accum", pa.int64()),
        ("num_workers", pa.int64()),
        ("lr", pa.float64()),
        ("seed", pa.int64()),
        ("status", pa.string()),
    ]
)
# the nuisance hyper-parameters (besides the split columns): trials of one batch size that agree on these and on
# micro_batch_size / grad_accum / num_workers are repeats (seeds) of one nuisance setting; the optional ones are
# used when present
NUISANCE_COLUMNS = ("lr", "warmup_steps", "beta2", "weight_decay")
SPLIT_COLUMNS = ("micro_batch_size", "grad_accum", "num_workers")
METRICS_SCHEMA = pa.schema(
    [
        ("trial_id", pa.string()),
        ("step", pa.int64()),
        ("examples", pa.int64()),
        ("metric", pa.string()),
        ("value", pa.float64()),
    ]
)
WALL_TIME = pa.field("wall_time", pa.float64())  # optional column of metrics.parquet
METRICS_SCHEMA_WITH_WALL_TIME = METRICS_SCHEMA.append(WALL_TIME)


class RunsTableError(BcritError):
    """A runs table breaks the contract; the message names the file, the column and the fix."""


def trials_table(rows: Mapping[str, Sequence[Any]]) -> pa.Table:
    """Build a ``trials.parquet`` table from columns; extra hyper-parameter columns are kept as given."""
    extra = [k for k in rows if k not in TRIALS_SCHEMA.names]
    schema = pa.schema(list(TRIALS_SCHEMA) + [pa.field(k, pa.array(rows[k]).type) for k in extra])
    return validate_trials(pa.table({k: rows[k] for k in schema.names}, schema=schema))


def metrics_table(rows: Mapping[str, Sequence[Any]]) -> pa.Table:
    """Build a ``metrics.parquet`` table from columns (``wall_time`` optional)."""
    schema = METRICS_SCHEMA_WITH_WALL_TIME if "wall_time" in rows else METRICS_SCHEMA
    return pa.table({k: rows[k] for k in schema.names}, schema=schema)


def _is_string(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _is_string(t.value_type)
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _check_columns(table: pa.Table, schema: pa.Schema, file: str, optional: Sequence[pa.Field] = ()) -> None:
    for field in [*schema, *optional]:
        if field.name not in table.column_names:
            if field in optional:
                continue
            raise RunsTableError(
                f"{file}: missing column {field.name!r} ({field.type}); "
                f"write the table with analysis.sources.schema.{_schema_name(file)}"
            )
        got = table.schema.field(field.name).type
        ok = _is_string(got) if pa.types.is_string(field.type) else got == field.type
        if not ok:
            raise RunsTableError(
                f"{file}: column {field.name!r} has type {got}, expected {field.type}; "
                f"cast it, e.g. table.cast(analysis.sources.schema.{_schema_name(file)})"
            )
        if table.column(field.name).null_count:
            raise RunsTableError(f"{file}: column {field.name!r} has null values; every row needs one")


def _schema_name(file: str) -> str:
    return "TRIALS_SCHEMA" if file == TRIALS_FILE else "METRICS_SCHEMA"


def validate_trials(table: pa.Table) -> pa.Table:
    """Check a ``trials.parquet`` table against the contract; return it unchanged or raise RunsTableError."""
    _check_columns(table, TRIALS_SCHEMA, TRIALS_FILE)
    codes, ids = string_codes(table.column("trial_id"))
    counts = np.bincount(codes, minlength=len(ids))
    if (counts > 1).any():
        dup = [ids[i] for i in np.flatnonzero(counts > 1)[:3]]
        raise RunsTableError(f"{TRIALS_FILE}: column 'trial_id' has duplicates {dup}; keep one row per trial")
    bad = pc.invert(pc.is_in(pc.cast(table.column("status"), pa.string()), pa.array(STATUSES)))
    if pc.any(bad).as_py():
        first = pc.filter(table.column("status"), bad)[0].as_py()
        raise RunsTableError(f"{TRIALS_FILE}: column 'status' has {first!r}; use one of {list(STATUSES)}")
    for col in ("batch_size", "micro_batch_size", "grad_accum", "num_workers"):
        if table.num_rows and pc.min(table.column(col)).as_py() < 1:
            raise RunsTableError(f"{TRIALS_FILE}: column {col!r} must be >= 1")
    return table


def validate_metrics(table: pa.Table, trial_ids: pa.Array | pa.ChunkedArray | None = None) -> pa.Table:
    """Check a ``metrics.parquet`` table; with ``trial_ids`` (from trials.parquet) also reject unknown trials.

    Duplicate ``(trial_id, step, metric)`` rows are detected in O(n) when rows are sorted (the recommended
    layout) and by sorting otherwise.
    """
    _check_columns(table, METRICS_SCHEMA, METRICS_FILE, optional=[WALL_TIME])
    if table.num_rows == 0:
        return table
    tid, tdict = string_codes(table.column("trial_id"))
    mid, mdict = string_codes(table.column("metric"))
    step = table.column("step").to_numpy()
    if step.min() < 0:
        raise RunsTableError(f"{METRICS_FILE}: column 'step' has negative values; steps count from 0")
    if trial_ids is not None:
        known = set(pc.cast(trial_ids, pa.string()).to_pylist())
        unknown = [t for t in tdict if t not in known]
        if unknown:
            raise RunsTableError(
                f"{METRICS_FILE}: column 'trial_id' has {len(unknown)} ids not in {TRIALS_FILE} "
                f"(e.g. {unknown[:3]}); add their trial rows or drop their metrics"
            )
    key = (tid.astype(np.int64) * (int(step.max()) + 1) + step) * len(mdict) + mid
    diff = np.diff(key)
    if not (diff > 0).all():
        uniq, counts = np.unique(key, return_counts=True)
        if (counts > 1).any():
            k = int(uniq[np.argmax(counts > 1)])
            t, rest = divmod(k, (int(step.max()) + 1) * len(mdict))
            s, mm = divmod(rest, len(mdict))
            raise RunsTableError(
                f"{METRICS_FILE}: duplicate rows for (trial_id, step, metric) = "
                f"({tdict[t]!r}, {s}, {mdict[mm]!r}); report each metric once per step"
            )
    return table


def string_codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """Integer codes and the dictionary of a string column (dictionary-encoded on the fly if needed)."""
    if isinstance(col, pa.Array):
        col = pa.chunked_array([col])
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    col = col.unify_dictionaries()
    if col.num_chunks == 0:
        return np.zeros(0, np.int64), []
    codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in col.chunks])
    return codes.astype(np.int64, copy=False), col.chunk(0).dictionary.cast(pa.string()).to_pylist()
