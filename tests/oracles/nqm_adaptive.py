"""The adaptive sweep on the noisy quadratic model without Ray: the decision rule of
:mod:`analysis.features.adaptive.next_trials` choosing each next trial, every trial simulated by
:func:`tests.oracles.nqm.simulate_sweep` (same stop rules as ``workload: quadratic``). Used to measure the
adaptive sweep's coverage under its own stopping rule and its saving against the grid (benchmarks/bench_adaptive.py).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from analysis.features.adaptive.next_trials import CONFIRM_BOOTSTRAP, Budget, Decision, Goal, Space, Trial, next_trials
from analysis.sources.loaders import Runs, runs_from_tables
from tests.oracles.nqm import simulate_sweep


def run_trial(h, c, theta0, t: Trial, sweep_seed: int, **stop) -> Runs:
    """One NQM trial ``t`` (its own noise stream from ``(sweep_seed, B, lr, seed)``) as a one-trial ``Runs``."""
    key = np.random.SeedSequence([sweep_seed, t.batch_size, int(round(t.lr * 1e9)), t.seed]).generate_state(1)[0]
    r = simulate_sweep(h, c, theta0, [t.batch_size], [t.lr], seeds=1, seed=int(key), **stop)
    tid = f"nqm_b{t.batch_size}_lr{t.lr:g}_s{t.seed}"
    trials = r.trials.set_column(r.trials.schema.get_field_index("trial_id"), "trial_id", pa.array([tid]))
    i = trials.schema.get_field_index("seed")
    trials = trials.set_column(i, trials.schema.field(i), pa.array([t.seed], trials.schema.field(i).type))
    metrics = r.metrics.set_column(
        r.metrics.schema.get_field_index("trial_id"), "trial_id", pa.array([tid] * r.metrics.num_rows)
    )
    return runs_from_tables(trials, metrics, source="nqm-adaptive")


def concat(a: Runs | None, b: Runs) -> Runs:
    if a is None:
        return b
    return runs_from_tables(
        pa.concat_tables([a.trials, b.trials]), pa.concat_tables([a.metrics, b.metrics]), source=a.source
    )


def adaptive_sweep(
    h, c, theta0, space: Space, goal: Goal, budget: Budget, sweep_seed: int, bootstrap: int = CONFIRM_BOOTSTRAP, **stop
) -> tuple[Runs, Decision, list[Decision]]:
    """Run the adaptive loop one trial at a time until it stops; ``(runs, final decision, every decision)``."""
    runs: Runs | None = None
    history: list[Decision] = []
    while True:
        dec = next_trials(runs, space, goal, budget, n=1, bootstrap=bootstrap, seed=sweep_seed)
        history.append(dec)
        if dec.stop is not None or not dec.choices:
            assert runs is not None
            return runs, dec, history
        runs = concat(runs, run_trial(h, c, theta0, dec.choices[0].trial, sweep_seed, **stop))
