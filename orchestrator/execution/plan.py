"""What a sweep (or a branched study) will run and cost, before it runs: ``bcrit sweep SPEC --dry-run`` and ``bcrit
branch SPEC --dry-run``.

The plan is built the way a real launch builds it (orchestrator.execution.launch.prepare): the trial configs checked
by `orchestrator.execution.preflight.check_trials` against the resources they will get -- with ``RAY_ADDRESS`` set,
what the cluster can hold (orchestrator.cluster.capacity, joined to read it), else the local Ray a sweep would start,
which is not started -- and the concurrency Tune would get (orchestrator.cluster.sizing.concurrency). Nothing
is written: not the sweep directory, not MLflow.

The cost: each trial's step budget (``max_steps``: an upper bound, as a trial that reaches its target or falls
behind stops earlier), its examples (steps x batch size), and, with a throughput from a past sweep of the same
workload, preset, dataset and device (its ``trials.parquet``: ``step``, ``train_seconds``, ``startup_seconds`` per
trial), its seconds; the wall time is those trials scheduled in grid order on the concurrency's slots, each holding
its slot for its own seconds plus the past sweep's time per trial outside them (Ray's start and end of a trial, the
driver's work: `overhead`, measured from its trials' ``started_at`` / ``ended_at``). An estimate follows the bound:
each batch size's trials stopping at the share of ``max_steps`` they took in that sweep.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow.parquet as pq

from analysis.sources.mlflow_uri import TrackingUriError, check_tracking_uri, sqlite_path
from orchestrator.cluster import capacity, ray_start
from orchestrator.cluster.ray_start import local_resources, on_cluster, sweep_cpus
from orchestrator.cluster.sizing import concurrency, max_concurrent, ray_cpus, trial_need
from orchestrator.errors import UserError
from orchestrator.execution.preflight import check_trials, local_where
from orchestrator.execution.sweep_state import NO_SWEEP, has_results, sweep_state
from orchestrator.specs.branch_spec import check_branch_spec
from orchestrator.specs.yaml_overrides import load_yaml
from orchestrator.storage.layout import SPEC_FILE

# the spec keys a throughput must share with the sweep it is quoted for (the model, the data, the device)
SAME = (("workload",), ("fixed", "preset"), ("fixed", "dataset"), ("scientific", "use_gpu"))


@dataclass(frozen=True)
class Plan:
    """A sweep's trials as it would launch them: ``configs`` (checked), what they are checked against (``where``), the
    trials Tune runs at once (``concurrency``), and its kind (``sweep`` or ``branched study``)."""

    name: str
    configs: list[dict]
    where: str
    concurrency: int
    kind: str = "sweep"
    search: str = "grid"
    notes: list[str] = field(default_factory=list)


def sweep_plan(spec) -> Plan:
    """The plan of `orchestrator.execution.launch.prepare` without its side effects: no Ray started, nothing
    written."""
    notes = check_places(spec.sweep_dir, spec.mlflow_uri, spec.storage_uri)
    if on_cluster():
        cap = cluster_capacity()
        configs = check_trials(spec, None, cap)
        held, where = cap.total, cap.describe()
    else:
        local = local_resources(spec)
        configs = check_trials(spec, local)
        held = {**local, "CPU": float(sweep_cpus(spec, configs))}  # the local Ray's size (launch.prepare)
        where = local_where(held)
    n = concurrency(configs, held, spec.search, on_cluster())
    if spec.search == "adaptive":
        notes.append(f"adaptive search: at most {spec.num_trials()} trials, chosen as results come in")
    return Plan(spec.name, configs, where, n, "sweep", spec.search, notes)


def branch_plan(spec) -> Plan:
    """A branched study's plan: its reference trial, then its branches (with a placeholder parent)."""
    notes = check_places(spec.sweep_dir, spec.mlflow_uri, None)
    with tempfile.TemporaryDirectory() as tmp:  # the study's own checks write a probe file: here, not in its directory
        elsewhere = dataclasses.replace(spec, sweep_dir=tmp, mlflow_uri=f"sqlite:///{tmp}/mlflow.db")
        cap = cluster_capacity() if on_cluster() else None
        ref, branches = check_branch_spec(elsewhere, cap.total if cap else None)
    if cap is not None:
        held, where = cap.total, cap.describe()
    else:
        # torch: deferred, the dry run (bcrit sweep --dry-run) loads this module
        import torch

        held = {"CPU": float(ray_cpus([ref, *branches])), "GPU": float(torch.cuda.device_count())}
        where = local_where(held)
    if spec.checkpoints:
        notes.append(f"reference: its kept checkpoints at {spec.checkpoints} (not trained)")
        configs = branches
    else:
        configs = [ref, *branches]
    notes.append("the reference trains first, alone; the branches then run at the concurrency above")
    return Plan(spec.name, configs, where, max_concurrent(branches or [ref], held), "branched study", "grid", notes)


def cluster_capacity():
    """What the cluster at ``RAY_ADDRESS`` can hold: joined (no Ray started), read, as a launch reads it."""
    ray_start.connect()  # both looked up at call time: tests stand in a cluster
    return capacity.capacity()


def check_places(sweep_dir: str, mlflow_uri: str, storage_uri: str | None) -> list[str]:
    """The sweep directory and the MLflow store checked without writing to either (a real launch writes a probe
    file and creates them); returns what the plan notes about them. Raises UserError as a launch would."""
    if os.path.exists(sweep_dir) and not os.path.isdir(sweep_dir):
        raise UserError(f"storage {sweep_dir!r} is a file, not a directory; choose another storage path")
    if not os.access(_existing_parent(sweep_dir), os.W_OK):
        raise UserError(f"storage {sweep_dir!r} is not writable; choose another storage path")
    notes = []
    if sweep_state(sweep_dir, storage_uri) != NO_SWEEP or has_results(sweep_dir):
        notes.append(f"{sweep_dir} already holds a sweep: run it with --resume, or set storage to a new directory")
    if sqlite_path(mlflow_uri) is None:  # a server or a database: reachable now (a SQLite file is created at launch)
        try:
            check_tracking_uri(mlflow_uri, create=True, what="tracking.mlflow_uri")
        except TrackingUriError as e:
            raise UserError(str(e)) from None
    return notes


def _existing_parent(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


# --- throughput: a past sweep's seconds per step --------------------------------------------------------------------
@dataclass(frozen=True)
class Throughput:
    """A past sweep's measured speed: seconds per optimizer step and start-up seconds per trial, by split
    (batch size, micro, accumulation, world size, in process), and per example by kind (in process or not) for the
    splits it did not run."""

    source: str
    per_step: dict[tuple, float]
    startup: dict[tuple, float]
    per_example: dict[bool, float]
    startup_kind: dict[bool, float]
    gpu: bool
    used: dict[int, float] = field(default_factory=dict)  # batch size -> the share of max_steps its trials took
    overhead: Overhead | None = None  # None: the past sweep's trials carry no started_at / ended_at


@dataclass(frozen=True)
class Overhead:
    """A past sweep's seconds per trial outside the trials' own: ``inside`` a trial's span (Ray's start and end of
    its actor or worker group; by kind, in process or not: a worker group costs more) and ``between`` a trial's end
    and the next one's start on the slot it freed (the driver's work), means over its trials; ``slots``: the most it
    ran at once; ``wall``: its first trial's start to its last one's end, per driver (a resumed sweep's pause left
    out)."""

    inside: dict[bool, float]
    between: float
    trials: int
    slots: int
    wall: float

    def inside_of(self, cfg: dict) -> float:
        """The seconds a trial of ``cfg``'s kind spans beyond its own (a kind not run there: the kinds' mean)."""
        return self.inside.get(split_key(cfg)[4], sum(self.inside.values()) / len(self.inside))


def overhead(rows: list[dict]) -> Overhead | None:
    """The `Overhead` of a past sweep's trials.parquet rows: None when no trial carries both ends of its span."""
    timed = [r for r in rows if r.get("started_at") and r.get("ended_at")]
    if not timed:
        return None
    inside, drivers = defaultdict(list), defaultdict(list)
    for r in timed:
        own = (r.get("startup_seconds") or 0.0) + (r.get("train_seconds") or 0.0)
        inside[bool(r.get("in_process"))].append(max(0.0, r["ended_at"] - r["started_at"] - own))  # resumed: own > span
        drivers[r.get("driver_started_at")].append((r["started_at"], r["ended_at"]))
    gaps = [g for spans in drivers.values() for g in _gaps(sorted(spans))]
    return Overhead(
        {k: sum(v) / len(v) for k, v in inside.items()},
        sum(gaps) / len(gaps) if gaps else 0.0,
        len(timed),
        max(_most_at_once(spans) for spans in drivers.values()),
        sum(max(b for _, b in spans) - min(a for a, _ in spans) for spans in drivers.values()),
    )


def _gaps(spans: list[tuple[float, float]]) -> list[float]:
    """Each trial's wait after the slot it took was freed: its start less the earliest end, at or before it, that
    no trial has started after yet (which freed slot it took does not change the sum)."""
    freed, gaps = [], []
    for a, b in spans:
        ready = min((e for e in freed if e <= a), default=None)
        if ready is not None:
            freed.remove(ready)
            gaps.append(a - ready)
        freed.append(b)
    return gaps


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, d in events:  # an end before a start at the same instant: a slot handed on, not two trials at once
        now += d
        most = max(most, now)
    return most


def split_key(cfg: dict) -> tuple:
    """A trial's split as trials.parquet records it (its ``num_workers`` is the world size)."""
    w = int(cfg.get("num_workers", 0))
    accum = int(cfg.get("grad_accum") or 1)
    return (int(cfg["batch_size"]), int(cfg["micro_batch_size"]), accum, max(1, w), w == 0)


def throughput_from(sweep_dir: str, spec_raw: dict) -> Throughput:
    """The throughput of the sweep in ``sweep_dir``, refused in one line unless it ran the same workload, preset,
    dataset and device as ``spec_raw`` (the planned spec's YAML) and has trials with measured seconds."""
    saved = os.path.join(sweep_dir, SPEC_FILE)
    trials = os.path.join(sweep_dir, "trials.parquet")
    if not (os.path.isfile(saved) and os.path.isfile(trials)):
        raise UserError(f"--throughput-from {sweep_dir}: not a sweep directory (no {SPEC_FILE} and trials.parquet)")
    past = load_yaml(saved)
    for path in SAME:
        mine, theirs = _get(spec_raw, path), _get(past, path)
        if mine != theirs:
            raise UserError(
                f"--throughput-from {sweep_dir}: its {'.'.join(path)} is {theirs!r}, this spec's {mine!r}; "
                "quote a sweep of the same workload, preset, dataset and device"
            )
    rows = pq.read_table(trials).to_pylist()
    steps, secs, starts = defaultdict(float), defaultdict(float), defaultdict(list)
    kind_ex, kind_s, kind_start = defaultdict(float), defaultdict(float), defaultdict(list)
    took, budget = defaultdict(float), defaultdict(float)
    for r in rows:
        s, t = r.get("step"), r.get("train_seconds")
        if not s or not t:
            continue
        key = (r["batch_size"], r["micro_batch_size"], r["grad_accum"], r["num_workers"], bool(r.get("in_process")))
        steps[key] += s
        secs[key] += t
        starts[key].append(r.get("startup_seconds") or 0.0)
        kind_ex[key[4]] += s * r["batch_size"]
        kind_s[key[4]] += t
        kind_start[key[4]].append(r.get("startup_seconds") or 0.0)
        if r.get("max_steps"):
            took[key[0]] += s
            budget[key[0]] += r["max_steps"]
    if not steps:
        raise UserError(f"--throughput-from {sweep_dir}: no trial with measured steps and train_seconds")
    return Throughput(
        sweep_dir,
        {k: secs[k] / steps[k] for k in steps},
        {k: sum(v) / len(v) for k, v in starts.items()},
        {k: kind_s[k] / kind_ex[k] for k in kind_ex},
        {k: sum(v) / len(v) for k, v in kind_start.items()},
        bool(_get(past, ("scientific", "use_gpu"))),
        {b: took[b] / budget[b] for b in budget},
        overhead(rows),
    )


def _get(d: dict, path: tuple) -> object:
    for k in path:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def trial_seconds(cfg: dict, steps: int, tp: Throughput) -> float | None:
    """A trial's predicted seconds (start-up + ``steps`` at the measured rate of its split, else of its kind)."""
    key = split_key(cfg)
    if key in tp.per_step:
        return tp.startup[key] + steps * tp.per_step[key]
    if key[4] in tp.per_example:
        return tp.startup_kind[key[4]] + steps * key[0] * tp.per_example[key[4]]
    return None


def busy_until(seconds: list[float], between: float, slots: int) -> float:
    """`makespan` of trials that hold their slot ``between`` seconds past their own before the next one starts
    there: the time the last one ends (its own ``between`` not counted)."""
    return makespan([s + between for s in seconds], slots) - between


def makespan(seconds: list[float], slots: int) -> float:
    """Trials started in order on ``slots`` slots, each on the first one free: the time the last one ends."""
    free = [0.0] * max(1, slots)
    for s in seconds:
        i = min(range(len(free)), key=free.__getitem__)
        free[i] += s
    return max(free)


# --- printing --------------------------------------------------------------------------------------------------------
def show(plan: Plan, tp: Throughput | None = None) -> list[str]:
    """The plan's lines: one per batch size and split (its learning rates, seeds, trials, step budget), the totals,
    and with a throughput the predicted seconds."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for c in plan.configs:
        groups[(int(c["batch_size"]), int(c["micro_batch_size"]), int(c.get("grad_accum") or 1),
                int(c.get("num_workers", 0)))].append(c)  # fmt: skip
    out = [f"[bcrit] dry run of {plan.kind} {plan.name!r}: nothing started, nothing written"]
    out.append(f"[bcrit] {'batch':>6} {'split':>9}  {'trials':>6}  {'max_steps':>9}  learning rates / seeds")
    for (b, micro, accum, w), cs in sorted(groups.items()):
        lrs = sorted({float(c["lr"]) for c in cs})
        seeds = sorted({int(c.get("seed", 0)) for c in cs})
        budget = sorted({int(c.get("max_steps", 0)) for c in cs})
        out.append(
            f"[bcrit] {b:>6} {f'{micro}x{accum}x{w}':>9}  {len(cs):>6}  {'/'.join(map(str, budget)):>9}  "
            f"lr {' '.join(f'{x:g}' for x in lrs)}; seeds {' '.join(map(str, seeds))}"
        )
    steps = [int(c.get("max_steps", 0)) for c in plan.configs]
    examples = sum(s * int(c["batch_size"]) for s, c in zip(steps, plan.configs, strict=True))
    count = f"at most {len(plan.configs)}" if plan.search == "adaptive" else str(len(plan.configs))
    out.append(f"[bcrit] {count} trials (split: micro x grad_accum x num_workers), {plan.concurrency} at once on "
               f"{plan.where}")  # fmt: skip
    out.append(
        f"[bcrit] at most {sum(steps):,} optimizer steps, {examples:,} examples: every trial to its max_steps (an "
        "upper bound: a trial that reaches the target or falls behind stops earlier)"
    )
    for note in plan.notes:
        out.append(f"[bcrit] note: {note}")
    if tp is None:
        out.append("[bcrit] time: unknown (add --throughput-from SWEEP_DIR: a past sweep of the same preset, device)")
        return out
    secs = [trial_seconds(c, s, tp) for c, s in zip(plan.configs, steps, strict=True)]
    known = [s for s in secs if s is not None]
    if len(known) < len(secs):
        out.append(f"[bcrit] time: {len(secs) - len(known)} trials of a kind {tp.source} did not run: not counted")
    between = tp.overhead.between if tp.overhead else 0.0
    wall = busy_until(_held(secs, plan.configs, tp.overhead), between, plan.concurrency)
    line = f"[bcrit] at most {wall / 3600:.2f} wall hours ({wall:.0f} s, {plan.concurrency} trials at once)"
    if tp.gpu:
        gpu_s = sum(s * trial_need(c).get("GPU", 0.0) for s, c in zip(secs, plan.configs, strict=True) if s is not None)
        line += f", {gpu_s / 3600:.2f} GPU hours"
    out.append(f"{line}; {sum(known) / 3600:.2f} trial hours, at the speed of {tp.source}")
    out.append(_overhead_line(tp))
    if tp.used:  # the estimate: each batch size's trials stopping as early (in share of max_steps) as they did there
        every = sum(tp.used.values()) / len(tp.used)
        est = [s * tp.used.get(int(c["batch_size"]), every) for c, s in zip(plan.configs, steps, strict=True)]
        est_s = [trial_seconds(c, round(n), tp) for c, n in zip(plan.configs, est, strict=True)]
        est_ex = sum(n * int(c["batch_size"]) for c, n in zip(plan.configs, est, strict=True))
        wall = busy_until(_held(est_s, plan.configs, tp.overhead), between, plan.concurrency)
        out.append(
            f"[bcrit] if trials stop as early as in {tp.source}: ~{sum(est):,.0f} steps, ~{est_ex:,.0f} examples, "
            f"~{wall / 3600:.2f} wall hours ({wall:.0f} s)"
        )
    return out


def _held(secs: list[float | None], configs: list[dict], o: Overhead | None) -> list[float]:
    """The seconds each trial of a known kind holds its slot: its own, plus Ray's inside its span where measured."""
    return [s + (o.inside_of(c) if o else 0.0) for s, c in zip(secs, configs, strict=True) if s is not None]


def _overhead_line(tp: Throughput) -> str:
    o = tp.overhead
    if o is None:
        return (
            "[bcrit] (the trials' own seconds: Ray's start and end of each trial and the driver's work come on top; "
            f"{tp.source}'s trials carry no started_at / ended_at to measure them)"
        )
    kinds = " / ".join(
        f"{o.inside[k]:.1f} s {'in process' if k else 'a worker group'}" for k in sorted(o.inside, reverse=True)
    )
    return (
        f"[bcrit] (each trial's own seconds + Ray's time per trial, measured in {tp.source}: {kinds} inside a "
        f"trial, {o.between:.1f} s between trials; its {o.trials} trials kept {o.slots} slots busy for {o.wall:.0f} s)"
    )
