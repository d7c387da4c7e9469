"""Every metric name and counter the platform reports, defined once.

The trainables report these names, the orchestrator writes them to MLflow and Parquet, the analysis reads
them. The metric tables of docs/metrics.md are generated from `METRIC_DOCS` (keep it in sync: a test checks).
"""

from __future__ import annotations

# --- counters reported with every result -----------------------------------------------------------------
STEP = "step"  # optimizer updates done
MICRO_STEP = "micro_step"  # forward/backward passes done by each worker (= step * grad_accum)
EXAMPLES = "examples"  # training examples consumed (= step * batch_size)
EPOCH = "epoch"  # fractional passes over the training set (= examples / train-set size)

# --- losses ------------------------------------------------------------------------------------------------
TRAIN_LOSS = "train/loss"  # mean epsilon-MSE of the effective batch of this step (all workers, all micro-batches)
LR = "train/lr"  # learning rate used for this step
GRAD_NORM = "train/grad_norm"  # |g| of the all-reduced gradient before clipping
EVAL_LOSS = "eval/loss"  # held-out epsilon-MSE, fixed examples/noise/timesteps (common random numbers)
EVAL_LOSS_BIN = "eval/loss/bin{k}"  # the same restricted to timestep bin k

# --- system metrics, at every report (trainables.sys_metrics) ---------------------------------------------------
SYS_EXAMPLES_PER_S = "sys/examples_per_s"  # training examples / training seconds over the last report interval
SYS_PEAK_MEM_GB = "sys/peak_mem_gb"  # peak memory (GiB): CUDA max allocated, or the worker's peak RSS on CPU


# --- gradient noise scale (McCandlish et al. 2018), global, every step ----------------------------------
GNS_G2_SMALL = "gns/g2_small"  # |G_b|^2: mean squared norm of the small-batch gradients of this step
GNS_G2_BIG = "gns/g2_big"  # |G_B|^2: squared norm of the big-batch (all-reduced) gradient
GNS_B_SMALL = "gns/b_small"  # b: examples in each small-batch gradient (mean size: halves of an odd micro-batch)
GNS_B_BIG = "gns/b_big"  # B: examples in the big-batch gradient
GNS_G2 = "gns/g2"  # unbiased |G|^2 of this step alone (noisy; may be negative)
GNS_TRACE = "gns/trace"  # unbiased tr(Sigma) of this step alone (noisy)
GNS_B_SIMPLE = "gns/b_simple"  # B_simple = mean tr(Sigma) / mean |G|^2 over the last gns_window steps (see half)
GNS_B_SIMPLE_SE = "gns/b_simple_se"  # its standard error (delta method on the window means)
GNS_B_SIMPLE_UNDEFINED = "gns/b_simple_undefined"  # running count of updates whose window had no valid ratio

# --- the same per timestep bin k, every `gns_every` steps ------------------------------------------------
GNS_BIN_G2_SMALL = "gns/bin{k}/g2_small"
GNS_BIN_G2_BIG = "gns/bin{k}/g2_big"
GNS_BIN_B_SMALL = "gns/bin{k}/b_small"
GNS_BIN_B_BIG = "gns/bin{k}/b_big"
GNS_BIN_G2 = "gns/bin{k}/g2"
GNS_BIN_TRACE = "gns/bin{k}/trace"
GNS_BIN_B_SIMPLE = "gns/bin{k}/b_simple"
GNS_BIN_B_SIMPLE_SE = "gns/bin{k}/b_simple_se"
GNS_BIN_B_SIMPLE_UNDEFINED = "gns/bin{k}/b_simple_undefined"

# --- adaLN-gradient GNS (config gns_adaln): the modulation parameters' per-example gradients of the training step,
# every step into the window, logged at each report; globally and per timestep bin k (analysis.core.gns_pairs)
GNS_ADALN_G2_MEAN = "gns/adaln/g2_mean"  # window mean of the per-step unbiased |G|^2 (pair mean)
GNS_ADALN_TRACE_MEAN = "gns/adaln/trace_mean"  # window mean of the per-step unbiased tr(Sigma)
GNS_ADALN_MEASUREMENTS = "gns/adaln/measurements"  # steps in the window that measured (had a pair)
GNS_ADALN_B_SIMPLE = "gns/adaln/b_simple"  # trace_mean / g2_mean: the modulation parameters' noise scale
GNS_ADALN_B_SIMPLE_SE = "gns/adaln/b_simple_se"
GNS_ADALN_B_SIMPLE_UNDEFINED = "gns/adaln/b_simple_undefined"
GNS_ADALN_BIN_G2_MEAN = "gns/adaln/bin{k}/g2_mean"
GNS_ADALN_BIN_TRACE_MEAN = "gns/adaln/bin{k}/trace_mean"
GNS_ADALN_BIN_MEASUREMENTS = "gns/adaln/bin{k}/measurements"
GNS_ADALN_BIN_B_SIMPLE = "gns/adaln/bin{k}/b_simple"
GNS_ADALN_BIN_B_SIMPLE_SE = "gns/adaln/bin{k}/b_simple_se"
GNS_ADALN_BIN_B_SIMPLE_UNDEFINED = "gns/adaln/bin{k}/b_simple_undefined"

# --- timestep allocation (config timestep_sampling noise / loss), at each re-estimation -----------------------
ALLOC_BIN_P = "alloc/bin{k}/p"  # probability of drawing timestep bin k (uniform = its share of the timesteps)

# --- trial status (trials.parquet `status`, MLflow tag `status`) ------------------------------------------
STATUS_RUNNING = "running"
STATUS_REACHED_TARGET = "reached_target"
STATUS_BUDGET_SPENT = "budget_spent"
STATUS_DIVERGED = "diverged"
STATUS_FAILED = "failed"
# ended by its sweep: an adaptive sweep met its goal while the trial ran (trainables.sweep_signal); its rows are kept
# and its examples counted as spent, but it is not fitted (the answer is the finished trials' it stopped on)
STATUS_ENDED = "ended_at_goal"
# stopped by its sweep once the fit could only use it as evidence of being slower (stopping.behind: the rule of
# analysis.features.stop_behind.stop_behind); fitted as every trial that has not reached a target is: right-censored
STATUS_BEHIND = "stopped_behind"
STOP_REASON = "stop_reason"  # why, in its last result, its trials.parquet row and its MLflow tags
FINAL_STATUSES = (
    STATUS_REACHED_TARGET, STATUS_BUDGET_SPENT, STATUS_DIVERGED, STATUS_FAILED, STATUS_ENDED, STATUS_BEHIND,
)  # fmt: skip


def gns_names(k: int | None = None) -> dict[str, str]:
    """The GNS metric names of one stream (global, ``k=None``, or timestep bin ``k``) by role."""
    glob = {
        "g2_small": GNS_G2_SMALL, "g2_big": GNS_G2_BIG, "b_small": GNS_B_SMALL, "b_big": GNS_B_BIG,
        "g2": GNS_G2, "trace": GNS_TRACE, "b_simple": GNS_B_SIMPLE, "b_simple_se": GNS_B_SIMPLE_SE,
        "b_simple_undefined": GNS_B_SIMPLE_UNDEFINED,
    }  # fmt: skip
    if k is None:
        return glob
    return {role: name.replace("gns/", f"gns/bin{k}/", 1) for role, name in glob.items()}


def adaln_names(k: int | None = None) -> dict[str, str]:
    """The adaLN-gradient GNS metric names (global, ``k=None``, or timestep bin ``k``) by role."""
    glob = {
        "g2_mean": GNS_ADALN_G2_MEAN, "trace_mean": GNS_ADALN_TRACE_MEAN, "measurements": GNS_ADALN_MEASUREMENTS,
        "b_simple": GNS_ADALN_B_SIMPLE, "b_simple_se": GNS_ADALN_B_SIMPLE_SE,
        "b_simple_undefined": GNS_ADALN_B_SIMPLE_UNDEFINED,
    }  # fmt: skip
    if k is None:
        return glob
    return {role: name.replace("gns/adaln/", f"gns/adaln/bin{k}/", 1) for role, name in glob.items()}


# --- MLflow child runs only (orchestrator.records.mlflow_tracking): sortable copies and the outcome of each trial
# ------------
WALL_TIME = "wall_time"  # training seconds of the trial when the row was measured (metrics.parquet `wall_time`)
STEPS_TO_TARGET = "steps_to_target"  # step of the first eval at or below the target (reached_target trials only)
EXAMPLES_TO_TARGET = "examples_to_target"  # = steps_to_target x batch_size
SECONDS_TO_TARGET = "seconds_to_target"  # training seconds until then (start-up excluded)
SCIENTIFIC = ("batch_size", "micro_batch_size", "grad_accum", "num_workers", "lr")  # numeric copies of the params
TRACKING_ONLY = (STEP, EXAMPLES, WALL_TIME, STEPS_TO_TARGET, EXAMPLES_TO_TARGET, SECONDS_TO_TARGET, *SCIENTIFIC)

# --- MLflow parent run of a sweep only (orchestrator.features.adaptive.adaptive_view): one point per refit of an
# adaptive sweep ----
ADAPTIVE_REL_CI = "adaptive/rel_ci"  # relative half-width of the widest interval the goal looks at
ADAPTIVE_REL_CI_GLOBAL = "adaptive/rel_ci_global"  # goal.bins: the same over the global targets only
ADAPTIVE_BIN_REL_CI = "adaptive/bin{k}/rel_ci"  # goal.bins: the same for timestep bin k (trusted bins only)


def per_bin(template: str, k: int) -> str:
    """Name of a per-bin metric, e.g. ``per_bin(EVAL_LOSS_BIN, 3) == "eval/loss/bin3"``."""
    return template.format(k=k)


METRIC_DOCS: dict[str, str] = {
    STEP: "optimizer updates done",
    MICRO_STEP: "forward/backward passes per worker (`step x grad_accum`)",
    EXAMPLES: "training examples consumed (`step x batch_size`)",
    EPOCH: "passes over the training set (`examples / train size`, fractional)",
    TRAIN_LOSS: "epsilon-MSE of this step's effective batch",
    LR: "learning rate used for this step",
    GRAD_NORM: "norm of the all-reduced gradient, before clipping",
    EVAL_LOSS: "held-out epsilon-MSE; fixed examples, noise and timesteps (common random numbers)",
    EVAL_LOSS_BIN: "the same on the held-out examples whose fixed timestep lies in bin k",
    SYS_EXAMPLES_PER_S: "training examples per second over the last report interval: `steps x batch_size` (all "
    "workers) over the training seconds of those steps on rank 0's step timer (the clock of `train_seconds`: wall "
    "clock per step on CPU, CUDA events on a GPU; per-bin GNS passes included, evaluation and checkpoints not)",
    SYS_PEAK_MEM_GB: "peak memory of rank 0 in GiB (2^30 bytes), at each report: on a GPU "
    "`torch.cuda.max_memory_allocated` of its device since training began; on CPU the worker process's peak "
    "resident set size (`resource.getrusage` `ru_maxrss`), whole process",
    GNS_G2_SMALL: "`|G_b|^2`, mean squared norm of this step's small-batch gradients",
    GNS_G2_BIG: "`|G_B|^2`, squared norm of this step's big-batch gradient",
    GNS_B_SMALL: "`b`, examples per small-batch gradient (their mean: `micro / 2` for the two halves of an odd "
    "micro-batch, e.g. 4.5)",
    GNS_B_BIG: "`B`, examples in the big-batch gradient",
    GNS_G2: "unbiased `|G|^2` from this step alone",
    GNS_TRACE: "unbiased `tr(Sigma)` from this step alone",
    GNS_B_SIMPLE: "`B_simple`: mean `tr(Sigma)` over mean `|G|^2` of the steps in the last `gns_window` steps (the "
    "time constant; with `gns_window_half`, the default, at most the last half of the steps so far); logged only "
    "when defined (>= 2 measurements, mean `|G|^2 > 0`, mean `tr(Sigma) >= 0`)",
    GNS_B_SIMPLE_SE: "standard error of `gns/b_simple` (delta method on the two window means, with their covariance)",
    GNS_B_SIMPLE_UNDEFINED: "running count of steps whose window gave no valid `B_simple` (mean `|G|^2 <= 0` or "
    "mean `tr(Sigma) < 0`: nothing is logged then); logged when it grows",
    GNS_BIN_G2_SMALL: "per-bin `|G_b|^2` (measurement pass, every `gns_every` steps)",
    GNS_BIN_G2_BIG: "per-bin `|G_B|^2`",
    GNS_BIN_B_SMALL: "per-bin `b`",
    GNS_BIN_B_BIG: "per-bin `B`",
    GNS_BIN_G2: "per-bin unbiased `|G_k|^2`",
    GNS_BIN_TRACE: "per-bin unbiased `tr(Sigma_k)`",
    GNS_BIN_B_SIMPLE: "per-bin `B_simple`: the same window of `gns_window` *steps* (so `gns_window / gns_every` "
    "measurements)",
    GNS_BIN_B_SIMPLE_SE: "its standard error",
    GNS_BIN_B_SIMPLE_UNDEFINED: "per-bin running count of measurements without a valid `B_simple`",
    GNS_ADALN_G2_MEAN: "adaLN-gradient GNS (`gns_adaln`, every step, logged at each report): window mean of the "
    "per-step unbiased `|G|^2` of the modulation parameters' gradient (every block's adaLN-Zero linear and the final "
    "layer's `proj_out_1`), the mean of `g_i . g_j` over pairs of examples of one micro-batch",
    GNS_ADALN_TRACE_MEAN: "window mean of the per-step unbiased `tr(Sigma)` of the same parameters (mean `|g_i|^2` "
    "minus the pair mean)",
    GNS_ADALN_MEASUREMENTS: "steps in the window that measured (all of them globally; per bin, the steps with two "
    "examples of the bin in one micro-batch)",
    GNS_ADALN_B_SIMPLE: "`trace_mean / g2_mean`: the noise scale of the modulation parameters, over the same window "
    "as `gns/b_simple` (`gns_window`, `gns_window_half`); not the whole model's B_simple (docs/gns.md, "
    '"adaLN-gradient GNS"); logged only when defined',
    GNS_ADALN_B_SIMPLE_SE: "its standard error (delta method on the window means, as `gns/b_simple_se`)",
    GNS_ADALN_B_SIMPLE_UNDEFINED: "running count of reports whose window gave no valid ratio; logged when non-zero",
    GNS_ADALN_BIN_G2_MEAN: "the same restricted to timestep bin k (pairs of the bin's examples only)",
    GNS_ADALN_BIN_TRACE_MEAN: "per-bin window mean `tr(Sigma_k)`",
    GNS_ADALN_BIN_MEASUREMENTS: "per-bin measurements in the window",
    GNS_ADALN_BIN_B_SIMPLE: "per-bin `trace_mean / g2_mean` of the modulation parameters, every step's window",
    GNS_ADALN_BIN_B_SIMPLE_SE: "its standard error",
    GNS_ADALN_BIN_B_SIMPLE_UNDEFINED: "per-bin running count of reports without a valid ratio",
    ALLOC_BIN_P: "probability of drawing a training timestep from bin k (`timestep_sampling` `noise` / `loss`; "
    "logged every `alloc_every` steps; its examples carry the weight `q_k / p_k`, `q_k` the bin's share of the "
    "timesteps; docs/allocation.md)",
}


TRACKING_DOCS: dict[str, str] = {
    "batch_size": "effective batch size `B = micro x A x W` (numeric copy of the param, at step 0)",
    "micro_batch_size": "examples per forward/backward on one worker",
    "grad_accum": "`A`, micro-batches accumulated per optimizer step",
    "num_workers": "`W`, data-parallel world size (1 for an in-process trial)",
    "lr": "peak learning rate",
    EXAMPLES: "`step x batch_size`, at every step a row was reported (x-axis for charts)",
    WALL_TIME: "training seconds of the trial at that row (start-up and evaluation excluded)",
    STEPS_TO_TARGET: "optimizer steps to the first eval at or below `target_loss` (only when reached)",
    EXAMPLES_TO_TARGET: "`steps_to_target x batch_size`",
    SECONDS_TO_TARGET: "training seconds to the target (start-up excluded)",
}

PARENT_DOCS: dict[str, str] = {
    ADAPTIVE_REL_CI: "`nuisance.search: adaptive` only: after each refit, the relative half-width `(hi - lo) / "
    "(2 B_crit)` of the 90% B_crit interval at the goal target where it is widest (the one the sweep waits for; "
    "with `goal.bins: true` the widest of the global targets and the trusted timestep bins, named by the parent "
    "run's tag `bcrit.adaptive_widest`, e.g. `bin t=700-799 at 0.3`); step = trials finished at that refit. Not "
    "logged while a target has no fit yet",
    ADAPTIVE_REL_CI_GLOBAL: "`goal.bins: true` only: the same over the global targets alone",
    ADAPTIVE_BIN_REL_CI: "`goal.bins: true` only: the same for timestep bin k, the widest over the goal targets "
    "where the analysis trusts the bin (no flags); not logged at a refit where it trusts it at none (the decisions "
    "file and the report say why)",
}


def markdown_table(docs: dict[str, str] | None = None) -> str:
    """The metric tables of docs/metrics.md (``python -m analysis.core.metrics``; ``--tracking``: MLflow children;
    ``--parent``: a sweep's MLflow parent run)."""
    lines = ["| name | meaning |", "| --- | --- |"]
    lines += [f"| `{name}` | {doc} |" for name, doc in (METRIC_DOCS if docs is None else docs).items()]
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    print(markdown_table(TRACKING_DOCS if "--tracking" in args else PARENT_DOCS if "--parent" in args else None))
