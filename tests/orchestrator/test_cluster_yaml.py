"""cluster.yaml: Ray's own cluster-config validation (offline) and the security properties the config must keep.

Validation is what `ray up` does before it talks to AWS: ``prepare_config`` (merge with Ray's AWS defaults, merge
the setup commands, check the docker section, fill per-type min/max workers), then ``validate_config`` (Ray's JSON
schema ``ray-schema.json`` plus its cross-field checks). The rest of ``ray up``'s ``_bootstrap_config`` (auto-detecting
node resources, creating the key pair, IAM role and security group) needs AWS credentials and boto3, so it is not run;
cluster.yaml declares every node type's resources so nothing checked here depends on that auto-detection.

Every property is also checked to fail: each mutation below breaks one of them in a copy of the config.
"""

import copy
import re
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.check_cluster_cmd import option, tokens

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_YAML = ROOT / "cluster.yaml"

LOOPBACK = "127.0.0.1"
MLFLOW_PORT = "5000"
IMAGE_RE = re.compile(r"^rayproject/ray:(?P<version>\d+\.\d+\.\d+)(-py\d+)?-gpu$")
# EC2 families with NVIDIA GPUs (head must not be one; workers must be one).
GPU_FAMILIES = {"g4dn", "g5", "g6", "g6e", "gr6", "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6"}
COMMAND_KEYS = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands")
HEAD_ONLY_KEYS = ("head_setup_commands", "head_start_ray_commands")
# libyaml when present: keeps the ~30 load/dump round trips of this module well under a second.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _load(text: str) -> dict:
    return yaml.load(text, Loader=_Loader)


def _dump(cfg: dict) -> str:
    return yaml.dump(cfg, Dumper=_Dumper, sort_keys=False)


def ray_prepare_and_validate(config: dict) -> dict:
    """The offline part of ``ray up``: Ray's own fill-in and validation. Raises on an invalid config."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def _mlflow_servers(cmd: str) -> list[list[str]]:
    """The argument lists of every ``mlflow server`` / ``mlflow ui`` invocation in a shell command."""
    toks = tokens(cmd)
    return [
        toks[i + 2 :]
        for i in range(len(toks) - 1)
        if Path(toks[i]).name == "mlflow" and toks[i + 1] in ("server", "ui")
    ]


def _all_commands(cfg: dict) -> dict[str, list[str]]:
    keys = (*COMMAND_KEYS, "head_start_ray_commands", "worker_start_ray_commands")
    out = {k: list(cfg.get(k) or []) for k in keys}
    for name, nt in (cfg.get("available_node_types") or {}).items():
        for k in ("initialization_commands", "worker_setup_commands"):
            out[f"available_node_types.{name}.{k}"] = list(nt.get(k) or [])
    return out


def violations(text: str) -> list[str]:
    """Security and layout violations of a cluster.yaml text (empty list: all good). Also runs Ray's validation."""
    import ray

    cfg = _load(text)
    prepared = ray_prepare_and_validate(cfg)
    bad: list[str] = []

    # 1. Nothing bound to, or opened for, every address.
    #    (A whole address, so 10.0.0.0/8 is no match.)
    for shown, pattern in (("0.0.0.0", r"(?<![0-9.])0\.0\.0\.0(?![0-9])"), ("::/0", r"(?<![0-9a-fA-F:])::/0")):
        if re.search(pattern, text):
            bad.append(f"'{shown}' appears in the config")

    # 2. MLflow: exactly one server, started on the head only, bound to loopback, port 5000, sqlite store, artifacts on
    #    shared storage.
    cmds = _all_commands(cfg)
    servers = []
    for key, lst in cmds.items():
        for cmd in lst:
            for args in _mlflow_servers(cmd):
                if key not in HEAD_ONLY_KEYS:
                    bad.append(f"mlflow server started from {key} (runs beyond the head)")
                servers.append(args)
    if len(servers) != 1:
        bad.append(f"expected one mlflow server command on the head, found {len(servers)}")
    for args in servers:
        host = option(args, 0, "--host", "-h")
        if host != LOOPBACK:
            bad.append(f"mlflow server --host is {host!r}, must be {LOOPBACK}")
        port = option(args, 0, "--port", "-p")
        if port != MLFLOW_PORT:
            bad.append(f"mlflow server --port is {port!r}, must be {MLFLOW_PORT}")
        store = option(args, 0, "--backend-store-uri") or ""
        if not store.startswith("sqlite:////home/ray/mlflow/"):
            bad.append(f"mlflow backend store {store!r} is not sqlite:////home/ray/mlflow/...")
        if option(args, 0, "--default-artifact-root") is not None or "--no-serve-artifacts" in args:
            bad.append("mlflow server: clients would write artifacts themselves; proxy them (--artifacts-destination)")
        art = option(args, 0, "--artifacts-destination") or ""
        if not (art.startswith("/mnt/") or art.startswith("s3://")):
            bad.append(f"mlflow --artifacts-destination {art!r} is not on shared storage")

    # 3. Ray dashboard / Jobs API on loopback (`ray start --dashboard-host`; Ray's default is localhost).
    for key, lst in cmds.items():
        for cmd in lst:
            toks = tokens(cmd)
            for i, tok in enumerate(toks[:-1]):
                if tok == "ray" and toks[i + 1] == "start":
                    dash = option(toks, i + 2, "--dashboard-host")
                    if dash not in (None, LOOPBACK, "localhost"):
                        bad.append(f"{key}: ray start --dashboard-host {dash}")

    # 4. Images: rayproject/ray:<this Ray>-...-gpu everywhere, never the deprecated ray-ml.
    docker = cfg.get("docker") or {}
    images = {k: docker[k] for k in ("image", "head_image", "worker_image") if k in docker}
    for name, nt in cfg["available_node_types"].items():
        if "worker_image" in (nt.get("docker") or {}):
            images[f"{name}.worker_image"] = nt["docker"]["worker_image"]
    if "image" not in images:
        bad.append("docker.image missing")
    for where, image in images.items():
        m = IMAGE_RE.match(image)
        if "ray-ml" in image or not m:
            bad.append(f"{where}: {image!r} is not rayproject/ray:<version>[-pyXY]-gpu")
        elif m["version"] != ray.__version__:
            bad.append(f"{where}: image Ray {m['version']} differs from the installed Ray {ray.__version__}")

    # 5. Node types: a CPU head, GPU workers that scale from zero.
    head = cfg["head_node_type"]
    types = prepared["available_node_types"]
    head_type = types[head]
    if head_type["resources"].get("GPU", 0) != 0:
        bad.append("head node type advertises GPUs")
    if head_type["node_config"].get("InstanceType", "").split(".")[0] in GPU_FAMILIES:
        bad.append("head node type is a GPU instance")
    workers = {n: t for n, t in types.items() if n != head}
    if not workers:
        bad.append("no worker node type")
    for name, nt in workers.items():
        if nt["resources"].get("GPU", 0) < 1:
            bad.append(f"worker type {name} has no GPUs")
        if nt["node_config"].get("InstanceType", "").split(".")[0] not in GPU_FAMILIES:
            bad.append(f"worker type {name} is not a GPU instance type")
        if nt.get("min_workers") != 0:
            bad.append(f"worker type {name} min_workers is {nt.get('min_workers')}, must be 0")
        if nt.get("max_workers", 0) < 1:
            bad.append(f"worker type {name} max_workers < 1")

    # 6. Every node installs this package (the synced repo, editable), constrained so the image's Ray / torch stay.
    mounts = cfg.get("file_mounts") or {}
    repo_mounts = {remote for remote, local in mounts.items() if (ROOT / local).resolve() == ROOT}
    for key in ("head_setup_commands", "worker_setup_commands"):
        installs = []
        for cmd in prepared[key]:
            toks = tokens(cmd)
            for i in range(len(toks) - 1):
                if toks[i] == "pip" and toks[i + 1] == "install":
                    editable = option(toks, i + 2, "-e", "--editable")
                    constrained = option(toks, i + 2, "-c", "--constraint") is not None or "--no-deps" in toks
                    if editable in repo_mounts or any(t.startswith("bcrit @ git+") for t in toks[i + 2 :]):
                        installs.append(constrained)
        if not installs:
            bad.append(f"{key}: no `pip install -e <synced repo>` of this package")
        elif not all(installs):
            bad.append(f"{key}: the package install is not constrained (-c) or --no-deps; it may replace torch/ray")
    return bad


@pytest.fixture(scope="module")
def text() -> str:
    return CLUSTER_YAML.read_text()


def test_cluster_yaml_passes_ray_validation_and_security_checks(text):
    assert violations(text) == []


def test_ray_validation_fills_in_like_ray_up(text):
    prepared = ray_prepare_and_validate(_load(text))
    # merge_setup_commands: the common setup runs first on both node kinds.
    setup = _load(text)["setup_commands"]
    assert prepared["head_setup_commands"][: len(setup)] == setup
    assert prepared["worker_setup_commands"][: len(setup)] == setup
    # fill_node_type_min_max_workers: the head gets max_workers 0.
    assert prepared["available_node_types"][prepared["head_node_type"]]["max_workers"] == 0
    assert prepared["provider"]["type"] == "aws"


def _set_mlflow(cfg, old, new):
    cmds = cfg["head_start_ray_commands"]
    i = next(i for i, c in enumerate(cmds) if "mlflow server" in c)
    assert old in cmds[i]
    cmds[i] = cmds[i].replace(old, new)


def _mlflow_to_setup(cfg):
    cmds = cfg["head_start_ray_commands"]
    i = next(i for i, c in enumerate(cmds) if "mlflow server" in c)
    cfg["setup_commands"].append(cmds.pop(i))


def _worker(cfg):
    return next(t for n, t in cfg["available_node_types"].items() if n != cfg["head_node_type"])


def _head(cfg):
    return cfg["available_node_types"][cfg["head_node_type"]]


def _drop_constraint(cfg):
    cfg["setup_commands"] = [c.replace("-c /tmp/bcrit-constraints.txt ", "") for c in cfg["setup_commands"]]


MUTATIONS = {
    "mlflow on all interfaces": (lambda c: _set_mlflow(c, "--host 127.0.0.1", "--host 0.0.0.0"), "0.0.0.0"),
    "mlflow on a private IP": (lambda c: _set_mlflow(c, "--host 127.0.0.1", "--host=10.0.0.5"), "--host"),
    "mlflow host left to default": (lambda c: _set_mlflow(c, "--host 127.0.0.1 ", ""), "--host"),
    "mlflow on IPv6 any": (lambda c: _set_mlflow(c, "--host 127.0.0.1", "-h ::"), "--host"),
    "mlflow on another port": (lambda c: _set_mlflow(c, "--port 5000", "--port 8080"), "--port"),
    "mlflow started on workers too": (_mlflow_to_setup, "beyond the head"),
    "dashboard on a VPC address": (
        lambda c: c.__setitem__(
            "head_start_ray_commands",
            [
                x.replace("--dashboard-host=127.0.0.1", "--dashboard-host 172.31.0.9")
                for x in c["head_start_ray_commands"]
            ],
        ),
        "dashboard-host",
    ),
    "public rule for MLflow": (
        lambda c: c["provider"].__setitem__(
            "security_group",
            {
                "IpPermissions": [
                    {"FromPort": 5000, "ToPort": 5000, "IpProtocol": "tcp", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}
                ]
            },
        ),
        "0.0.0.0",
    ),
    "deprecated ray-ml image": (
        lambda c: c["docker"].__setitem__("image", "rayproject/ray-ml:2.60.0-py311-gpu"),
        "image",
    ),
    "cpu image": (lambda c: c["docker"].__setitem__("image", "rayproject/ray:2.60.0-py311-cpu"), "image"),
    "other Ray version": (lambda c: c["docker"].__setitem__("image", "rayproject/ray:2.9.0-py311-gpu"), "differs"),
    "ray-ml worker image": (lambda c: c["docker"].__setitem__("worker_image", "rayproject/ray-ml:latest-gpu"), "image"),
    "workers without GPUs": (lambda c: _worker(c)["resources"].pop("GPU"), "no GPUs"),
    "workers on a CPU type": (lambda c: _worker(c)["node_config"].__setitem__("InstanceType", "m5.24xlarge"), "GPU"),
    "workers always on": (lambda c: _worker(c).__setitem__("min_workers", 1), "min_workers"),
    "head with a GPU": (lambda c: _head(c)["resources"].__setitem__("GPU", 1), "head"),
    "head on a GPU type": (lambda c: _head(c)["node_config"].__setitem__("InstanceType", "g5.xlarge"), "head"),
    "package not installed": (
        lambda c: c.__setitem__("setup_commands", [x for x in c["setup_commands"] if "-e /home/ray/bcrit" not in x]),
        "pip install",
    ),
    "package install unconstrained": (_drop_constraint, "constrained"),
    "mlflow artifacts written by each client": (
        lambda c: c.__setitem__(
            "head_start_ray_commands",
            [x.replace("--artifacts-destination", "--default-artifact-root") for x in c["head_start_ray_commands"]],
        ),
        "proxy them",
    ),
    "repo not synced": (lambda c: c.__setitem__("file_mounts", {}), "pip install"),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_each_property_fails_when_broken(text, name):
    mutate, expect = MUTATIONS[name]
    cfg = _load(text)
    mutate(cfg)
    assert cfg != _load(text), f"mutation {name!r} changed nothing"
    bad = violations(_dump(cfg))
    assert bad, f"mutation {name!r} was not caught"
    assert any(expect in b for b in bad), bad


RAY_INVALID = {
    "unknown top-level key": lambda c: c.__setitem__("mlflow_port", 5000),
    "unknown docker key": lambda c: c["docker"].__setitem__("ports", ["5000:5000"]),
    "non-integer GPU count": lambda c: _worker(c)["resources"].__setitem__("GPU", "four"),
    "missing resources": lambda c: _worker(c).pop("resources"),
    "head type not defined": lambda c: c.__setitem__("head_node_type", "nope"),
    "min workers above max_workers": lambda c: _worker(c).__setitem__("min_workers", 99),
}


@pytest.mark.parametrize("name", list(RAY_INVALID))
def test_ray_validation_rejects_broken_configs(text, name):
    cfg = _load(text)
    RAY_INVALID[name](cfg)
    with pytest.raises(Exception) as err:  # jsonschema.ValidationError or ValueError, as `ray up` raises
        ray_prepare_and_validate(cfg)
    assert type(err.value).__name__ in ("ValidationError", "ValueError"), err.value


# ---- bcrit check-cluster: the cluster's front door (SSH ingress, loopback ports), through the CLI ----------------

SG = "sg-0123456789abcdef0"
CIDR = "203.0.113.0/24"


def _fill(text: str, sg: str = SG, cidr: str = CIDR) -> str:
    """The shipped file with its two network placeholders set, as a user would (an IPv6 CIDR under Ipv6Ranges)."""
    assert "sg-XXXXXXXX" in text and "X.X.X.X/32" in text
    text = text.replace("sg-XXXXXXXX", sg).replace("X.X.X.X/32", cidr)
    if ":" in cidr:
        text = text.replace("IpRanges:", "Ipv6Ranges:").replace("CidrIp:", "CidrIpv6:")
    return text


def _check(tmp_path, capsys, text: str, *flags: str) -> tuple[int, str, str]:
    from orchestrator.cli.main import main

    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    rc = main(["check-cluster", str(path), *flags])
    out, err = capsys.readouterr()
    return rc, out, err


def _refused(tmp_path, capsys, text: str, *flags: str) -> str:
    rc, out, err = _check(tmp_path, capsys, text, *flags)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bcrit check-cluster: error: "), err
    assert "Traceback" not in err and out == ""
    return lines[0]


@pytest.fixture
def ray_aws_config(monkeypatch):
    """Ray's AWS launcher module. It imports boto3/botocore at the top, which the test venv need not have: then
    stand-ins are put in sys.modules for this test only (no function that talks to AWS is called)."""
    import importlib
    import importlib.util
    import sys
    import types

    stubbed = importlib.util.find_spec("boto3") is None
    if stubbed:
        for name in ("boto3", "boto3.exceptions", "boto3.resources", "boto3.resources.base"):
            monkeypatch.setitem(sys.modules, name, _stub_module(name, types))
        for name in ("botocore", "botocore.client", "botocore.config", "botocore.exceptions"):
            monkeypatch.setitem(sys.modules, name, _stub_module(name, types))
        for name in [m for m in sys.modules if m.startswith("ray.autoscaler._private.aws")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setattr(sys.modules["boto3"], "__version__", "99.0", raising=False)
    module = importlib.import_module("ray.autoscaler._private.aws.config")
    yield module
    if stubbed:
        for name in [m for m in sys.modules if m.startswith("ray.autoscaler._private.aws")]:
            del sys.modules[name]  # imported against the stand-ins: do not leave them to other tests


def _stub_module(name, types):
    class _Any:
        def __init__(self, *args, **kwargs):
            pass

    module = types.ModuleType(name)
    module.__getattr__ = lambda attr: _Any
    return module


def test_ray_creates_no_group_only_when_every_node_type_names_one(text, ray_aws_config, monkeypatch):
    """The design rests on this Ray 2.60 behaviour (ray/autoscaler/_private/aws/config.py): a group Ray creates
    always gets SSH from the whole internet; with SecurityGroupIds on every node type it creates none."""
    assert ray_aws_config._create_default_ssh_inbound_rules()[0]["IpRanges"] == [{"CidrIp": "0.0.0.0/0"}]
    called = []
    monkeypatch.setattr(ray_aws_config, "_upsert_security_groups", lambda cfg, types: called.append(types) or {})
    filled = ray_prepare_and_validate(_load(_fill(text)))
    ray_aws_config._configure_security_group(copy.deepcopy(filled))
    assert called == []
    _worker(filled)["node_config"].pop("SecurityGroupIds")
    with pytest.raises(KeyError):  # the fake upsert returns no group; Ray was about to create one for the worker
        ray_aws_config._configure_security_group(filled)
    assert called == [["gpu_worker"]]


def test_shipped_file_is_refused_until_the_user_sets_the_group(tmp_path, capsys, text):
    line = _refused(tmp_path, capsys, text)
    assert "node_config.SecurityGroupIds is still the placeholder sg-XXXXXXXX" in line
    assert "SSH (22) from your CIDR" in line


def test_cidr_placeholder_is_refused(tmp_path, capsys, text):
    line = _refused(tmp_path, capsys, text.replace("sg-XXXXXXXX", SG))
    assert "provider.security_group.IpPermissions[0].IpRanges[0].CidrIp is still the placeholder" in line


@pytest.mark.parametrize("cidr", [CIDR, "198.51.100.7/32", "10.0.0.0/8", "2001:db8::/48"])
def test_filled_file_passes(tmp_path, capsys, text, cidr):
    filled = _fill(text, cidr=cidr)
    assert violations(filled) == []
    rc, out, err = _check(tmp_path, capsys, filled)
    assert rc == 0, err
    assert f"from {cidr} via {SG}" in out and err == ""


@pytest.mark.parametrize("world", ["0.0.0.0/0", "::/0"])
def test_world_ssh_needs_the_explicit_opt_in(tmp_path, capsys, text, world):
    filled = _fill(text, cidr=world)
    line = _refused(tmp_path, capsys, filled)
    assert f"is {world}, SSH from the whole internet" in line and "--allow-world-ssh" in line
    rc, out, err = _check(tmp_path, capsys, filled, "--allow-world-ssh")
    assert rc == 0 and "ok" in out
    assert "warning: SSH is open to the whole internet" in err


@pytest.mark.parametrize(
    "cidr, expect",
    [
        ("10.0.0.5/24", "the network is 10.0.0.0/24"),
        ("300.1.1.1/32", "not a valid CIDR"),
        ("198.51.100.7", "no prefix length"),
        ("10.0.0.0/33", "not a valid CIDR"),
        ("my-laptop", "no prefix length"),
        ("", "is not set"),
    ],
)
def test_bad_cidr_is_refused(tmp_path, capsys, text, cidr, expect):
    line = _refused(tmp_path, capsys, _fill(text, cidr=repr(cidr)))
    assert "IpRanges[0].CidrIp" in line and expect in line, line


def _edit(text: str, mutate) -> str:
    cfg = _load(_fill(text))
    mutate(cfg)
    return _dump(cfg)


def _rule(port: int, cidr: str) -> dict:
    return {"IpProtocol": "tcp", "FromPort": port, "ToPort": port, "IpRanges": [{"CidrIp": cidr}]}


FRONT_DOOR = {
    "worker without a group": (
        lambda c: _worker(c)["node_config"].pop("SecurityGroupIds"),
        "gpu_worker.node_config.SecurityGroupIds is not set, so Ray would create a group with SSH from 0.0.0.0/0",
    ),
    "not a group id": (lambda c: _head(c)["node_config"].__setitem__("SecurityGroupIds", ["default"]), "sg- and"),
    "no SSH rule stated": (lambda c: c["provider"].pop("security_group"), "IpPermissions is not set"),
    "MLflow port to the user's CIDR": (
        lambda c: c["provider"]["security_group"]["IpPermissions"].append(_rule(5000, CIDR)),
        "IpPermissions[1] opens tcp 5000-5000: only SSH (tcp 22)",
    ),
    "all ports": (
        lambda c: c["provider"]["security_group"]["IpPermissions"].__setitem__(
            0, {"IpProtocol": "-1", "IpRanges": [{"CidrIp": CIDR}]}
        ),
        "only SSH",
    ),
    "MLflow on all interfaces": (
        lambda c: _set_mlflow(c, "--host 127.0.0.1", "--host 0.0.0.0"),
        "head_start_ray_commands: mlflow server --host 0.0.0.0",
    ),
    "dashboard on all interfaces": (
        lambda c: c.__setitem__(
            "head_start_ray_commands",
            [x.replace("--dashboard-host=127.0.0.1", "--dashboard-host=0.0.0.0") for x in c["head_start_ray_commands"]],
        ),
        "ray start --dashboard-host 0.0.0.0",
    ),
    "not a Ray config": (lambda c: c.__setitem__("mlflow_port", 5000), "does not pass Ray's own validation"),
}


@pytest.mark.parametrize("name", list(FRONT_DOOR))
def test_front_door_violations_are_refused_in_one_line(tmp_path, capsys, text, name):
    mutate, expect = FRONT_DOOR[name]
    line = _refused(tmp_path, capsys, _edit(text, mutate))
    assert expect in line, line


def test_world_rule_for_another_port_is_refused_even_with_the_opt_in(tmp_path, capsys, text):
    edited = _edit(text, lambda c: c["provider"]["security_group"]["IpPermissions"].append(_rule(8265, "0.0.0.0/0")))
    assert "only SSH (tcp 22)" in _refused(tmp_path, capsys, edited, "--allow-world-ssh")


def test_unreadable_or_non_mapping_file_is_one_line(tmp_path, capsys):
    from orchestrator.cli.main import main

    assert main(["check-cluster", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert "not a Ray cluster config" in _refused(tmp_path, capsys, "- just a list\n")


def test_make_cluster_up_checks_before_ray_up():
    lines = (ROOT / "Makefile").read_text().split("\ncluster-up:", 1)[1].split("\n\n", 1)[0].splitlines()
    recipe = [ln.strip() for ln in lines[1:]]
    check = next(i for i, ln in enumerate(recipe) if "check-cluster" in ln)
    up = next(i for i, ln in enumerate(recipe) if "ray up" in ln)
    assert check < up


# --- a spec's storage on the shared mount (bcrit check-cluster --spec) ---------------------------------------------
def test_example_spec_storage_is_on_the_shared_mount(tmp_path, capsys, text):
    rc, out, err = _check(tmp_path, capsys, _fill(text), "--spec", str(ROOT / "examples/dit-s2-imagenet.yaml"))
    assert rc == 0, err
    assert "dit-s2-imagenet.yaml: storage on the shared mount" in out
    spec = yaml.safe_load((ROOT / "examples/dit-s2-imagenet.yaml").read_text())
    assert spec["fixed"]["dataset"].startswith("/mnt/bcrit/")  # the data every node reads, on the EFS mount too


@pytest.mark.parametrize(
    ("storage", "expect"),
    [
        ("/mnt/shared/bcrit/x", "is not on a mount every node shares (/mnt/bcrit)"),
        ("/mnt/bcrit-other/x", "is not on a mount every node shares"),
        ("/home/ray/runs/x", "is not on a mount every node shares"),
        ("./runs/x", "relative to wherever the driver starts"),
        (None, "unset (./runs/<name>)"),
    ],
)
def test_spec_storage_off_the_shared_mount_is_refused(tmp_path, capsys, text, storage, expect):
    spec = yaml.safe_load((ROOT / "examples/dit-s2-imagenet.yaml").read_text())
    spec.pop("storage")
    if storage is not None:
        spec["storage"] = storage
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    line = _refused(tmp_path, capsys, _fill(text), "--spec", str(path))
    assert expect in line and "set storage: /mnt/bcrit/runs/dit-s2-imagenet" in line


def test_spec_storage_uri_is_accepted_for_a_sweep_only(tmp_path, capsys, text):
    spec = yaml.safe_load((ROOT / "examples/dit-s2-imagenet.yaml").read_text())
    spec["storage"] = "s3://bucket/runs/dit"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    rc, out, err = _check(tmp_path, capsys, _fill(text), "--spec", str(path))
    assert rc == 0 and f"{path}: storage at a URI" in out, err
    branch = yaml.safe_load((ROOT / "examples/branched-quadratic.yaml").read_text())
    path.write_text(yaml.safe_dump({**branch, "storage": "s3://bucket/runs/b"}))
    line = _refused(tmp_path, capsys, _fill(text), "--spec", str(path))
    assert "is a URI; a branched study needs a shared path" in line


def test_shared_mounts_come_from_the_docker_volumes(text):
    from orchestrator.cli.check_cluster_cmd import shared_mounts

    cfg = yaml.safe_load(text)
    assert shared_mounts(cfg) == ["/mnt/bcrit"]
    cfg["docker"]["run_options"] = ["--volume=/efs:/data/", "-v /a:/b:ro"]
    assert shared_mounts(cfg) == ["/data", "/b"]


# --- the torch / ray pins of the setup (orchestrator/cluster/constraints.py)
# -----------------------------------------------
def test_setup_pins_distribution_versions_not_dunder_version(text):
    cfg = yaml.safe_load(text)
    setup = " ".join(cfg["setup_commands"])
    assert "orchestrator/cluster/constraints.py > /tmp/bcrit-constraints.txt" in setup and "__version__" not in setup


@pytest.mark.parametrize("dist", ["2.13.0+cu128", "2.13.0"])
def test_torch_pin_matches_a_cuda_wheel_with_a_local_tag(dist):
    """A CUDA wheel: ``torch.__version__`` is ``2.13.0+cu128`` while the distribution pip sees may or may not carry
    the local tag. The pin is the distribution's, so pip's constraint always admits what is installed."""
    from importlib import metadata

    from packaging.requirements import Requirement

    from orchestrator.cluster.constraints import constraint_lines

    versions = {"ray": "2.60.0", "torch": dist}

    def version(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    lines = constraint_lines(version, ("ray", "torch", "not-installed"))
    assert lines == ["ray==2.60.0", f"torch=={dist}"]
    pin = Requirement(lines[1])
    assert pin.specifier.contains(dist)
    if "+" not in dist:  # the old pin on torch.__version__ admits no installed distribution here
        assert not Requirement("torch==2.13.0+cu128").specifier.contains(dist)


def test_constraints_script_runs_standalone(tmp_path):
    import subprocess
    import sys
    from importlib import metadata

    out = subprocess.run(
        [sys.executable, str(ROOT / "orchestrator/cluster/constraints.py")], capture_output=True, text=True, check=True,
        cwd=tmp_path,
    ).stdout.split()  # fmt: skip
    assert f"ray=={metadata.version('ray')}" in out and f"torch=={metadata.version('torch')}" in out
