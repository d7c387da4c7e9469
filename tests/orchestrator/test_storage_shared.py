"""`orchestrator.storage.shared_dir`: a branched study's storage URI is refused in one line (not turned into a local
``./s3:/...`` directory; a sweep takes one: test_storage_uri.py), and on a multi-node Ray cluster a storage
directory that another node cannot see is refused before launch.

The cluster is ``ray.cluster_utils.Cluster`` (a head and a worker node on this machine, which share its file
system): the failure path makes the worker node blind through `check_shared_storage`'s ``probe`` parameter."""

from __future__ import annotations

import os

import pytest
import yaml

from orchestrator.errors import UserError
from tests.conftest import start_session_ray
from tests.orchestrator.conftest import quadratic_spec


@pytest.mark.parametrize("storage", ["s3://bucket/prefix", "gs://b/x", "file:///tmp/x"])
def test_storage_uri_of_a_branched_study_is_refused_in_one_line(tmp_path, storage, monkeypatch):
    from orchestrator.specs.branch_spec import parse_branch_spec
    from orchestrator.specs.sweep_spec import parse_spec

    monkeypatch.setenv("BCRIT_URI_CACHE", str(tmp_path / "cache"))
    spec = parse_spec(quadratic_spec(tmp_path, storage=storage))  # a sweep takes it (test_storage_uri.py)
    assert spec.storage_uri == storage and spec.sweep_dir.startswith(str(tmp_path / "cache"))
    branch = yaml.safe_load(open("examples/branched-quadratic.yaml"))
    with pytest.raises(UserError) as e:
        parse_branch_spec({**branch, "storage": storage})
    msg = str(e.value)
    assert "\n" not in msg and storage in msg and "is a URI" in msg and "/mnt/bcrit/runs" in msg
    assert not (tmp_path / "s3:").exists() and not os.path.exists(os.path.join(os.getcwd(), "s3:"))


def test_plain_path_is_kept(tmp_path):
    from orchestrator.specs.sweep_spec import parse_spec

    spec = parse_spec(quadratic_spec(tmp_path, storage=str(tmp_path / "s3-like:name")))
    assert spec.sweep_dir == str(tmp_path / "s3-like:name")


@pytest.fixture(scope="module")
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    session = ray.is_initialized()  # the session's local Ray (tests/conftest.py): left, and started again after
    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if session:
            start_session_ray()


@pytest.mark.slow
def test_shared_storage_passes_and_a_blind_node_is_refused(two_nodes, tmp_path):
    import ray

    from orchestrator.storage.shared_dir import check_shared_storage

    d = tmp_path / "sweep"
    assert check_shared_storage(str(d)) == 1  # the worker node sees the driver's marker: same file system
    assert os.listdir(d) == []  # the marker is gone again

    head = ray.get_runtime_context().get_node_id()

    def blind_elsewhere(path):  # a node other than the driver's cannot see the directory
        import ray as r

        if r.get_runtime_context().get_node_id() == head:
            return open(path).read()
        return None

    with pytest.raises(UserError) as e:
        check_shared_storage(str(d), probe=blind_elsewhere)
    msg = str(e.value)
    assert "\n" not in msg and "is not shared" in msg and "1 of 1 other nodes" in msg and str(d) in msg
    assert os.listdir(d) == []


@pytest.mark.slow
def test_check_spec_on_a_cluster_checks_the_storage(two_nodes, tmp_path, monkeypatch):
    """`check_spec` without resources (the RAY_ADDRESS path) runs the shared-storage check before validating."""
    import orchestrator.storage.shared_dir
    from orchestrator.execution.preflight import check_spec
    from orchestrator.specs.sweep_spec import parse_spec

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    spec = parse_spec(quadratic_spec(tmp_path))
    checked = []
    real = orchestrator.storage.shared_dir.check_shared_storage
    monkeypatch.setattr(
        orchestrator.storage.shared_dir, "check_shared_storage", lambda d: checked.append(real(d)) or checked[-1]
    )
    assert len(check_spec(spec)) == 4
    assert checked == [1]  # one other node, and it sees the sweep dir
