"""bcrit against an existing multi-node Ray cluster, through the CLI with ``RAY_ADDRESS`` (and Ray's token auth on),
as docs/cluster.md runs it. The cluster is real ``ray start`` processes on this machine
(orchestrator.features.rehearsal.local_cluster): a head (Tune drivers) and worker nodes that each hold one ``fake_gpu``,
an accelerator-like custom resource that the ``BCRIT_WORKER_RESOURCES`` hook makes every Train worker request, so CPU
trials are placed one worker per node as GPU trials would be. Quadratic workload: seconds per trial."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from analysis.core import metrics as M
from orchestrator.features.rehearsal.local_cluster import LocalCluster
from tests.orchestrator.conftest import kill_sweep_midway, write_spec
from tests.orchestrator.test_faults import check_consistent, slow_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a 3-node cluster starts in ~40 s on 2 shared cores
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOK = {"BCRIT_WORKER_RESOURCES": '{"fake_gpu": 1}'}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head of 2 CPUs and two worker nodes of 2 CPUs (a Tune driver may land there) and 1 fake_gpu each (port
    unique to these tests), shared by this module's tests; the test that loses a node adds a new one in its place."""
    c = LocalCluster(port=6411, head_cpus=2, logs=str(tmp_path_factory.mktemp("ray-logs")))
    try:
        c.start_head()
        for _ in range(2):
            c.add_worker(cpus=2, resources={"fake_gpu": 1})
        yield c
    finally:
        c.shutdown()


def bcrit(cluster: LocalCluster, *args: str, timeout: float = 400, watch=None) -> subprocess.CompletedProcess:
    """``bcrit ARGS`` in a child process joined to ``cluster``; ``watch()`` is called every 0.2 s while it runs
    (returns True to stop watching)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli.main", *args],
        env={**cluster.env(**HOOK), "PYTHONPATH": ROOT},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while watch is not None and proc.poll() is None and time.monotonic() < deadline:
            if watch():
                break
            time.sleep(0.2)
        stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def ddp_spec(tmp_path, workers: int, **fixed) -> dict:
    spec = slow_spec(tmp_path, **fixed)
    spec["scientific"] = {"batch_sizes": [32], "splits": [{"grad_accum": 1, "num_workers": workers}]}
    spec["nuisance"] = {"search": "grid", "lr": [0.5]}
    return spec


def _process_tree() -> tuple[dict[int, list[int]], dict[int, str]]:
    """(parent pid -> child pids, pid -> command line) of every process, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    cmdlines: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdlines[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children, cmdlines


def train_worker_nodes(cluster: LocalCluster) -> list[int]:
    """Indices of the nodes whose process trees hold a live Ray Train worker (``ray::RayTrainWorker``)."""
    children, cmdlines = _process_tree()
    out = []
    for i, node in enumerate(cluster.nodes):
        stack, found = [node.proc.pid], False
        while stack and not found:
            pid = stack.pop()
            found = pid != node.proc.pid and "RayTrainWorker" in cmdlines.get(pid, "")
            stack.extend(children.get(pid, []))
        if found and node.alive():
            out.append(i)
    return out


def test_cluster_ddp_trial_spans_two_nodes(tmp_path, cluster):
    """(a) ``bcrit sweep`` with RAY_ADDRESS: a 2-worker DDP trial (gloo across nodes), one worker on each
    fake_gpu node, none on the head."""
    spec = ddp_spec(tmp_path, 2, step_seconds=0.05)
    spec["stopping"]["max_steps"] = 40
    seen: set[int] = set()
    out = bcrit(cluster, "sweep", write_spec(tmp_path, spec), watch=lambda: seen.update(train_worker_nodes(cluster)))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert len(seen) == 2 and 0 not in seen, seen  # two worker nodes (a replaced one has a new index), not the head
    check_consistent(str(tmp_path / "sweep"), 1)


def test_cluster_refuses_what_no_node_can_hold(tmp_path, cluster):
    """A trial of 3 fake_gpu workers on a cluster that holds 2: one line, exit 2, nothing launched."""
    spec = ddp_spec(tmp_path, 3)
    spec["scientific"]["batch_sizes"] = [48]
    out = bcrit(cluster, "sweep", write_spec(tmp_path, spec), timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "needs 3 fake_gpus" in out.stderr and "has 2" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "sweep" / "tune").exists()


def test_cluster_driver_killed_then_resume(tmp_path, cluster, monkeypatch):
    """(c) The driver killed mid-sweep, then ``bcrit sweep DIR --resume`` against the same cluster."""
    spec = ddp_spec(tmp_path, 1)
    spec["nuisance"]["lr"] = [0.5, 1.0]
    for k, v in {**cluster.env(**HOOK)}.items():
        monkeypatch.setenv(k, v)
    assert kill_sweep_midway(tmp_path, write_spec(tmp_path, spec), parts_needed=3) >= 3
    out = bcrit(cluster, "sweep", str(tmp_path / "sweep"), "--resume")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    check_consistent(str(tmp_path / "sweep"), 2)


def test_cluster_adaptive_sweep_killed_then_resumed(tmp_path, cluster, monkeypatch):
    """An adaptive sweep (``nuisance.search: adaptive``) with RAY_ADDRESS, each trial one Train worker on a fake_gpu
    node: its driver killed mid-sweep, then ``bcrit sweep DIR --resume`` on the same cluster. The searcher's state
    comes back from the sweep directory: the budget holds across the kill (every trial finished, none extra, no
    setting run twice), the stop is recorded, tables and MLflow agree, and ``bcrit analyze`` reports the design."""
    import json

    from orchestrator.storage.layout import DECISIONS_FILE
    from tests.orchestrator.test_adaptive_sweep import BUDGET, adaptive_quadratic

    spec = adaptive_quadratic(tmp_path)
    spec["scientific"]["splits"] = [{"grad_accum": 1, "num_workers": 1}]
    for k, v in cluster.env(**HOOK).items():
        monkeypatch.setenv(k, v)
    assert kill_sweep_midway(tmp_path, write_spec(tmp_path, spec), parts_needed=3) >= 3
    sweep_dir = str(tmp_path / "sweep")
    before = json.loads(open(os.path.join(sweep_dir, DECISIONS_FILE)).read())["issued"]
    seen: set[int] = set()
    out = bcrit(cluster, "sweep", sweep_dir, "--resume", watch=lambda: seen.update(train_worker_nodes(cluster)))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert seen and seen <= {1, 2}, seen  # the resumed trials' Train workers ran on the fake_gpu nodes
    d = json.loads(open(os.path.join(sweep_dir, DECISIONS_FILE)).read())
    assert d["stop"] == "budget_trials", d["stop"]
    issued = {t["trial_id"] for t in d["issued"]}
    assert {t["trial_id"] for t in before} <= issued  # what the killed driver issued is kept, not re-chosen
    steps = check_consistent(sweep_dir, BUDGET)  # lost trials' rows removed by --resume; none lost, none extra
    assert set(steps) <= issued
    import pyarrow.parquet as pq

    trials = pq.read_table(os.path.join(sweep_dir, "trials.parquet")).to_pylist()
    assert len({(t["batch_size"], t["lr"], t["seed"]) for t in trials}) == BUDGET
    assert {t["num_workers"] for t in trials} == {1}
    quick = ("--targets", "0.5", "--bootstrap", "100", "--no-plots")
    rep = bcrit(cluster, "analyze", sweep_dir, *quick, "--out", str(tmp_path / "an"), timeout=200)
    assert rep.returncode == 0, rep.stderr[-3000:]
    report = (tmp_path / "an" / "report.md").read_text()
    assert "## Adaptive design" in report and "trial budget was spent" in report
    assert all(t["trial_id"] in report for t in d["issued"])


def test_cluster_goal_met_ends_the_train_workers_running_on_other_nodes(tmp_path, cluster):
    """``goal.running: end`` with RAY_ADDRESS, each trial one Train worker on a fake_gpu node: when the goal is met
    the driver's searcher sets the sweep's named actor (trainables.sweep_signal) and the trials running on the
    worker nodes read it there and end themselves (``ended_at_goal``): the sweep ends, nothing left running.

    Which trials are running when the goal is met depends on the order they finish in: the two in flight can
    finish within one refit, and then the goal is met with nothing to end (seen once in two runs). Only then is the
    sweep run again, with another refit seed, at most three times; a sweep whose goal asked trials to end must have
    ended one of them through the signal."""
    for attempt in range(3):
        asked, trials = _sweep_to_goal_ending_running(tmp_path / f"sweep{attempt}", cluster, seed=attempt)
        assert all(t["status"] in M.FINAL_STATUSES for t in trials.values())  # none left running
        assert {t["num_workers"] for t in trials.values()} == {1}
        if asked:
            ended = [t for t in asked if trials[t]["status"] == M.STATUS_ENDED]
            assert ended, (asked, [trials[t]["status"] for t in asked])  # Train workers on other nodes read it
            return
    pytest.fail("three sweeps met their goal with no trial running: nothing was left to end through the signal")


def _sweep_to_goal_ending_running(sweep_dir, cluster, seed: int) -> tuple[list[str], dict[str, dict]]:
    """Run examples/quadratic-adaptive.yaml on ``cluster`` with ``goal.running: end`` into ``sweep_dir``; check it
    stopped at its goal: (the trial ids its goal asked to end, every trial's row of trials.parquet by id)."""
    import json

    import pyarrow.parquet as pq

    from orchestrator.storage.layout import DECISIONS_FILE

    example = os.path.join(ROOT, "examples", "quadratic-adaptive.yaml")
    sets = [f"storage={sweep_dir}", "nuisance.goal.rel_ci=0.95", "nuisance.goal.running=end", f"nuisance.seed={seed}",
            "nuisance.goal.hold=false",  # with holding, the trials the goal would end are seldom started
            "fixed.step_seconds=0.004", "scientific.splits=[{grad_accum: 1, num_workers: 1}]"]  # fmt: skip
    out = bcrit(cluster, "sweep", example, *[x for s in sets for x in ("--set", s)], timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    d = json.loads(open(os.path.join(sweep_dir, DECISIONS_FILE)).read())
    assert d["stop"] == "goal_met", d["stop"]
    trials = {t["trial_id"]: t for t in pq.read_table(os.path.join(sweep_dir, "trials.parquet")).to_pylist()}
    return list(d["refits"][-1]["ending"]), trials


def test_cluster_node_lost_mid_trial(tmp_path, cluster):
    """(b) The worker node of a running 1-worker trial is lost (SIGKILL, as a machine gone): Ray Train restarts the
    worker on the other fake_gpu node from the last checkpoint; no trial lost or repeated, tables and MLflow
    complete."""
    spec = ddp_spec(tmp_path, 1, step_seconds=0.1)
    spec["stopping"]["max_steps"] = 100
    killed: list[int] = []

    def kill_busy_node() -> bool:  # once a checkpoint exists, lose the node that runs the trial's Train worker
        busy = [i for i in train_worker_nodes(cluster) if i > 0]
        if busy and list((tmp_path / "sweep").rglob("checkpoint_*")):
            cluster.kill(cluster.nodes[busy[0]])
            killed.append(busy[0])
            return True
        return False

    try:
        out = bcrit(cluster, "sweep", write_spec(tmp_path, spec), watch=kill_busy_node)
    finally:
        for _ in killed:  # the shared cluster whole again for the tests after this one, in any order
            cluster.add_worker(cpus=2, resources={"fake_gpu": 1})
    assert killed, "no checkpointed trial on a worker node to interrupt"
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    steps = check_consistent(str(tmp_path / "sweep"), 1)
    (trial_steps,) = steps.values()
    assert trial_steps[-1] == 100  # the trial finished its budget after the node was lost


def test_cluster_sweep_script_takes_the_cli_path(tmp_path, cluster):
    """examples/sweep_script.py (the Python sweep API) with RAY_ADDRESS: it joins the cluster, as ``bcrit sweep``
    does (orchestrator.execution.launch.prepare), instead of starting a Ray of its own."""
    out = subprocess.run(
        [sys.executable, "examples/sweep_script.py", "examples/quadratic.yaml", str(tmp_path / "sweep")],
        env={**cluster.env(**HOOK), "PYTHONPATH": ROOT},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    joined = re.search(rf"^Ray at \S+:{cluster.port}$", out.stdout, re.M)  # the cluster, not a Ray of its own
    assert joined, out.stdout[-2000:]
    assert "trials done" in out.stdout


def test_cluster_sweep_terminal_shows_bcrit_lines_only(tmp_path, cluster):
    """``bcrit sweep`` with RAY_ADDRESS and an MLflow tracking server (where MLflow prints "View run ..." for every
    run it ends): the terminal shows bcrit's lines, the parent's link at most once, and no traceback from a trial
    worker being ended, on stdout or stderr. Six 1-worker trials of two batch sizes, so that Tune ends actors on the
    worker nodes while others still run."""
    from orchestrator.features.rehearsal.local_services import mlflow_server

    spec = ddp_spec(tmp_path, 1, step_seconds=0.01)
    spec["scientific"]["batch_sizes"] = [16, 32]
    spec["nuisance"]["lr"] = [0.3, 0.5, 0.8]
    spec["stopping"]["max_steps"] = 30
    with mlflow_server(str(tmp_path / "server")) as uri:
        spec["tracking"] = {"mlflow_uri": uri, "experiment": "terminal"}
        out = bcrit(cluster, "sweep", write_spec(tmp_path, spec))
    terminal = out.stdout + out.stderr
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "[6/6]" in out.stdout, out.stdout[-2000:]  # every trial's line, from bcrit itself
    assert terminal.count("View run") <= 1 and terminal.count("View experiment") <= 1, terminal[-3000:]
    for noise in ("Traceback", "Exception ignored", "SystemExit"):
        assert noise not in terminal, terminal[-3000:]
