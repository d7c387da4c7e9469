"""Which analysis a sweep gets (analysis.reporting.sweep_kind): branched, or the S(B) fit on its constant-batch
trials of the uniform sampler; what it leaves out said in a note, runs no analysis takes refused in one line."""

from __future__ import annotations

import pyarrow as pa
import pytest

from analysis.core import metrics as M
from analysis.reporting.sweep_kind import BRANCHED, SWEEP, KindError, sweep_kind
from analysis.sources.loaders import runs_from_tables
from analysis.sources.schema import BRANCH_COLUMNS, PARENT


def runs(n: int = 4, **columns):
    """``n`` trials (two batch sizes) with one eval each, ``columns`` added to trials.parquet."""
    ids = [f"t{i}" for i in range(n)]
    trials = {"trial_id": ids, "batch_size": [16 * (1 + i % 2) for i in range(n)], "micro_batch_size": [16] * n,
              "grad_accum": [1 + i % 2 for i in range(n)], "num_workers": [1] * n, "lr": [0.1] * n, "seed": [0] * n,
              "status": [M.STATUS_REACHED_TARGET] * n, **columns}  # fmt: skip
    metrics = {"trial_id": ids, "step": [0] * n, "examples": [0] * n, "metric": [M.EVAL_LOSS] * n, "value": [1.0] * n}
    return runs_from_tables(pa.table(trials), pa.table(metrics))


def test_a_plain_sweep_is_fit_as_it_is():
    r = runs()
    k = sweep_kind(r)
    assert k.kind == SWEEP and k.runs is r and k.all_runs is r and k.notes == () and not k.compares_samplers


def test_a_branched_study_gets_the_branched_report():
    cols = {c: [None, "t0", "t0", "t0"] if c == PARENT else [None, 10, 10, 10] for c in BRANCH_COLUMNS}
    assert sweep_kind(runs(**cols)).kind == BRANCHED
    none = {c: pa.nulls(4, pa.string() if c == PARENT else pa.int64()) for c in BRANCH_COLUMNS}
    assert sweep_kind(runs(**none)).kind == SWEEP  # the columns without a branch row: a sweep


def test_scheduled_trials_are_left_out_and_only_scheduled_is_refused():
    k = sweep_kind(runs(batch_schedule=[None, "[[10, 64]]", "", "null"]))
    assert k.kind == SWEEP and k.runs.trial_ids == ["t0", "t2", "t3"] and k.all_runs is k.runs
    assert len(k.notes) == 1 and k.notes[0].startswith("1 trial(s) with a batch_schedule left out")
    with pytest.raises(KindError, match="every trial follows a batch_schedule") as e:
        sweep_kind(runs(batch_schedule=["[[10, 64]]"] * 4))
    assert "docs/schedule.md" in str(e.value) and "benchmarks/" not in str(e.value)


def test_a_comparison_of_samplers_is_fit_on_its_uniform_trials():
    k = sweep_kind(runs(timestep_sampling=[None, "uniform", "logit_normal", "logit_normal"]))
    assert k.kind == SWEEP and k.compares_samplers
    assert k.runs.trial_ids == ["t0", "t1"] and k.all_runs.trial_ids == ["t0", "t1", "t2", "t3"]
    assert k.notes == ("samplers ['logit_normal', 'uniform']: B_crit from the uniform trials, the comparison appended "
                       "to the report (bcrit allocate for more)",)  # fmt: skip
    with pytest.raises(KindError, match="without uniform; analyse it per sampler"):
        sweep_kind(runs(timestep_sampling=["a", "a", "b", "b"]))
