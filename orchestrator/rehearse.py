"""``make cluster-local`` (``python -m orchestrator.rehearse``): the cluster path of docs/cluster.md rehearsed on
one machine, with no cloud account. It starts a Ray head and two worker raylets (orchestrator.local_cluster: real
``ray start`` processes; token auth on, as Ray 2.60 starts a head), then runs the same commands docs/cluster.md
gives against it with ``RAY_ADDRESS`` set -- ``bcrit sweep`` of a small spec (2-worker DDP trials, one worker per
worker node), ``bcrit analyze``, and ``bcrit recommend`` for a spec whose workload reports throughput (the default
quadratic one reports no ``sys/examples_per_s``, which ``recommend`` needs) -- prints the answer and where to
browse MLflow, and ends every node it started (nothing else), also on Ctrl-C or failure.

Hooks for what a real cluster adds (``services``): tracking and storage are whatever the environment says. Today
the MLflow store is the sweep's embedded SQLite file and storage a local directory; an MLflow server
(``MLFLOW_TRACKING_URI=http://...``) or S3-compatible storage (``--set storage=s3://...``) plug in through
:func:`services`, which yields the environment and ``--set`` overrides the commands run with."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile

from orchestrator.local_cluster import LocalCluster

SPEC = "examples/quadratic.yaml"
# one worker per worker node (the accelerator-like hook: each worker node holds one fake_gpu), small and quick
OVERRIDES = [
    "name=cluster-local",
    "scientific.batch_sizes=[64,256,1024]",
    "scientific.splits=[{grad_accum: 1, num_workers: 2}]",
    "nuisance.lr=[0.8,1.6]",
    "stopping.max_steps=500",
    "nuisance.search=grid",
]
HOOK = {"BCRIT_WORKER_RESOURCES": '{"fake_gpu": 1}'}


@contextlib.contextmanager
def services(workdir: str):
    """(extra environment, extra ``--set`` overrides) of the tracking server and storage the rehearsal uses.
    Default: a local storage directory under ``workdir`` and the sweep's embedded MLflow store."""
    yield {}, [f"storage={os.path.join(workdir, 'runs', 'cluster-local')}"]


def _bcrit(env: dict, *args: str) -> None:
    print(f"\n$ RAY_ADDRESS={env['RAY_ADDRESS']} bcrit {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, check=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.rehearse", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=6421, help="the head's GCS port (default 6421)")
    p.add_argument("--workdir", default=None, help="where the sweep goes (default: a new temporary directory)")
    p.add_argument("--spec", default=SPEC, help=f"sweep spec (default {SPEC}, shrunk by the rehearsal's --set)")
    args = p.parse_args(argv)
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="bcrit-cluster-local-"))
    os.makedirs(workdir, exist_ok=True)
    cluster = LocalCluster(port=args.port, head_cpus=2, logs=os.path.join(workdir, "ray-logs"))
    try:
        print(f"[rehearse] Ray head on {cluster.address} (token auth), logs in {cluster.logs}", flush=True)
        cluster.start_head()
        for i in range(2):
            cluster.add_worker(cpus=2, resources={"fake_gpu": 1})
            print(f"[rehearse] worker node {i + 1} joined (2 CPUs, 1 fake_gpu)", flush=True)
        with services(workdir) as (extra_env, extra_set):
            env = {**cluster.env(**HOOK, **extra_env), "PYTHONPATH": os.getcwd()}
            sets = [x for kv in [*OVERRIDES, *extra_set] for x in ("--set", kv)]
            _bcrit(env, "sweep", args.spec, *sets)
            sweep_dir = next(s.split("=", 1)[1] for s in extra_set if s.startswith("storage="))
            _bcrit(env, "analyze", sweep_dir)
            if not args.spec.endswith("quadratic.yaml"):  # the quadratic workload reports no sys/ throughput
                _bcrit(env, "recommend", sweep_dir)
            uri = env.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.join(sweep_dir, 'mlflow.db')}"
            print(f"\n[rehearse] done. Sweep dir {sweep_dir}; browse MLflow: mlflow ui --backend-store-uri {uri}")
    except subprocess.CalledProcessError as e:
        print(f"[rehearse] failed: {' '.join(e.cmd[2:])} exited {e.returncode}; Ray logs in {cluster.logs}")
        return 1
    except RuntimeError as e:  # a node that did not start: the end of its log
        print(f"[rehearse] failed: {e}")
        return 1
    finally:
        cluster.shutdown()
        print("[rehearse] every node it started is stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
