"""``make cluster-local`` (``python -m orchestrator.features.rehearsal.rehearse``): the cluster path of docs/cluster.md
rehearsed on
one machine, with no cloud account. It starts a Ray head and two worker raylets
(orchestrator.features.rehearsal.local_cluster: real
``ray start`` processes; token auth on, as Ray 2.60 starts a head), an MLflow tracking server with proxied artifacts
(as cluster.yaml starts it on the head) and an S3-compatible store (``moto_server``;
orchestrator.features.rehearsal.local_services),
then runs the same commands docs/cluster.md gives against them, with ``RAY_ADDRESS``, ``MLFLOW_TRACKING_URI`` and
``AWS_ENDPOINT_URL_S3`` set: ``bcrit sweep`` of a small spec (2-worker DDP trials, one worker per worker node) with
``storage: s3://...``, ``bcrit analyze`` and ``bcrit recommend`` of that URI. It prints the answer and where to
browse MLflow, and ends every process it started (nothing else), also on Ctrl-C or failure. ``--no-services``: the
sweep's embedded MLflow store and a local storage directory instead."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile

from orchestrator.errors import UserError
from orchestrator.features.rehearsal.local_cluster import LocalCluster
from orchestrator.features.rehearsal.local_services import CREDENTIALS, make_bucket, mlflow_server, moto_server, s3_env
from orchestrator.storage.layout import MLFLOW_DB
from orchestrator.storage.uri import LOCAL_ROOT_ENV, local_dir

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


BUCKET = "bcrit-rehearsal"


@contextlib.contextmanager
def services(workdir: str, real: bool = True):
    """``(driver environment, node environment, storage)`` of the rehearsal: an MLflow server and an S3-compatible
    store (``real``), or the sweep's embedded MLflow store and a local directory. As on a real cluster, the nodes
    hold the store's credentials (an instance role there) and the driver says where the store is
    (``AWS_ENDPOINT_URL_S3``, passed on to every Ray worker by bcrit)."""
    if not real:
        yield {}, {}, os.path.join(workdir, "runs", "cluster-local")
        return
    with mlflow_server(os.path.join(workdir, "mlflow-server")) as uri, moto_server() as endpoint:
        make_bucket(endpoint, BUCKET)
        print(f"[rehearse] MLflow server {uri} (artifacts proxied); S3-compatible store http://{endpoint}", flush=True)
        env = {**s3_env(endpoint), "MLFLOW_TRACKING_URI": uri, LOCAL_ROOT_ENV: os.path.join(workdir, "uri-local")}
        yield env, dict(CREDENTIALS), f"s3://{BUCKET}/cluster-local"


def _first_target(storage: str, env: dict) -> str:
    """The first target of the analysis ``bcrit analyze`` just wrote (its local output directory for a URI)."""
    root = local_dir(storage, env.get(LOCAL_ROOT_ENV)) if "://" in storage else storage
    with open(os.path.join(root, "analysis", "bcrit.json")) as f:
        return str(json.load(f)["targets"][0]["target"])


def _bcrit(env: dict, *args: str) -> None:
    print(f"\n$ RAY_ADDRESS={env['RAY_ADDRESS']} bcrit {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], env=env, check=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m orchestrator.features.rehearsal.rehearse", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--port", type=int, default=6421, help="the head's GCS port (default 6421)")
    p.add_argument("--workdir", default=None, help="where the sweep goes (default: a new temporary directory)")
    p.add_argument("--spec", default=SPEC, help=f"sweep spec (default {SPEC}, shrunk by the rehearsal's --set)")
    p.add_argument("--no-services", action="store_true", help="no MLflow server or S3 store: local files instead")
    args = p.parse_args(argv)
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="bcrit-cluster-local-"))
    os.makedirs(workdir, exist_ok=True)
    stack = contextlib.ExitStack()
    cluster = LocalCluster(port=args.port, head_cpus=2, logs=os.path.join(workdir, "ray-logs"))
    try:
        extra_env, cluster.node_env, storage = stack.enter_context(services(workdir, real=not args.no_services))
        print(f"[rehearse] Ray head on {cluster.address} (token auth), logs in {cluster.logs}", flush=True)
        cluster.start_head()
        for i in range(2):
            cluster.add_worker(cpus=2, resources={"fake_gpu": 1})
            print(f"[rehearse] worker node {i + 1} joined (2 CPUs, 1 fake_gpu)", flush=True)
        env = {**cluster.env(**HOOK, **extra_env), "PYTHONPATH": os.getcwd()}
        sets = [x for kv in [*OVERRIDES, f"storage={storage}"] for x in ("--set", kv)]
        _bcrit(env, "sweep", args.spec, *sets)
        _bcrit(env, "analyze", storage)
        # the rehearsal's small sweep flags every target: recommend at the first (it says UNTRUSTED first)
        _bcrit(env, "recommend", storage, "--target", _first_target(storage, env))
        if args.no_services:
            browse = f"mlflow ui --backend-store-uri sqlite:///{os.path.join(storage, MLFLOW_DB)}"
        else:  # the server stops with the rehearsal; its store and artifacts stay in the workdir
            server = os.path.join(workdir, "mlflow-server")
            browse = (
                f"mlflow ui --backend-store-uri sqlite:///{os.path.join(server, MLFLOW_DB)} "
                f"--artifacts-destination {os.path.join(server, 'artifacts')}"
            )
        print(f"\n[rehearse] done. Storage {storage}; browse MLflow: {browse}")
    except subprocess.CalledProcessError as e:
        print(f"[rehearse] failed: {' '.join(e.cmd[2:])} exited {e.returncode}; Ray logs in {cluster.logs}")
        return 1
    except RuntimeError as e:  # a node or service that did not start: the end of its log
        print(f"[rehearse] failed: {e}")
        return 1
    except UserError as e:  # e.g. moto_server not installed
        print(f"[rehearse] {e}")
        return 2
    finally:
        cluster.shutdown()
        stack.close()
        print("[rehearse] every node and service it started is stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
