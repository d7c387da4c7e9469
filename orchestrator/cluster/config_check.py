"""A Ray cluster config (``cluster.yaml``) checked offline before any ``ray up`` (``bcrit check-cluster``).

Ray's AWS launcher (``ray/autoscaler/_private/aws/config.py``) creates a security group for every node type whose
``node_config`` has no ``SecurityGroupIds``, and always gives it SSH from ``0.0.0.0/0``
(``_create_default_ssh_inbound_rules``); ``provider.security_group.IpPermissions`` only adds rules beside that one.
With ``SecurityGroupIds`` on every node type Ray creates no group and adds no rule (``_configure_security_group``
returns early), so bcrit requires them: a group the user creates, with SSH from their CIDR and all traffic within
the group. The CIDR is stated in ``provider.security_group.IpPermissions`` (Ray's format for that rule; Ray applies
it only to a group it creates itself) and checked here.

Checks, each a one-line refusal (exit 2) naming the key and the fix:
1. the file passes Ray's own config validation (``prepare_config`` + ``validate_config``, as ``ray up`` does);
2. every node type names a security group (``SecurityGroupIds``), not the ``sg-XXXXXXXX`` placeholder;
3. ``provider.security_group.IpPermissions`` opens SSH (tcp 22) only, from valid CIDRs set by the user; the whole
   internet (``0.0.0.0/0``, ``::/0``) only with ``--allow-world-ssh``;
4. MLflow and the Ray dashboard listen on loopback only (reached through ``ray attach -p`` / ``ray dashboard``);
5. with ``--spec SPEC``: the spec's ``storage`` is an absolute path on a volume ``docker.run_options`` mounts on every
   node (``/mnt/bcrit``), where the GPU nodes can write their checkpoints.
"""

from __future__ import annotations

import copy
import ipaddress
import logging
import posixpath
import re
import shlex
from pathlib import Path

import yaml

from orchestrator.errors import UserError

SSH_PORT = 22
LOOPBACK = ("127.0.0.1", "localhost")
SG_ID_RE = re.compile(r"^sg-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
PLACEHOLDER_RE = re.compile(r"X{4,}|X\.X|YOUR", re.IGNORECASE)
SHELL_OPS = {"&", "&&", "||", ";", "|", "}", ")", ">", "2>&1", "<"}
COMMAND_KEYS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)
FIX_SG = "create a security group with SSH (22) from your CIDR and all traffic within the group (docs/cluster.md)"


def shared_mounts(cfg: dict) -> list[str]:
    """Container paths of the ``-v HOST:CONTAINER`` volumes that ``docker.run_options`` gives every node (cluster.yaml:
    the EFS mount ``/mnt/bcrit``)."""
    toks = [t for opt in (cfg.get("docker") or {}).get("run_options") or [] for t in tokens(str(opt))]
    out = []
    for i, tok in enumerate(toks):
        vol = toks[i + 1] if tok in ("-v", "--volume") and i + 1 < len(toks) else None
        vol = vol or (tok.split("=", 1)[1] if tok.startswith(("-v=", "--volume=")) else None)
        if vol and ":" in vol:
            out.append(vol.split(":")[1].rstrip("/") or "/")
    return out


def check_spec_storage(cfg: dict, spec_path: str) -> str:
    """The spec's ``storage`` is an absolute path under a mount every node shares (its Ray Train checkpoints are
    written from the GPU nodes), or for a sweep a URI (s3://...); else one UserError line. Returns the storage."""
    from orchestrator.specs.yaml_overrides import load_yaml

    data = load_yaml(spec_path)
    if not isinstance(data, dict):
        raise UserError(f"{spec_path} is not a spec (expected a mapping at the top level)")
    mounts = shared_mounts(cfg)
    if not mounts:
        raise UserError("docker.run_options mounts no shared file system (-v /mnt/bcrit:/mnt/bcrit) on every node")
    name = data.get("name", "<name>")
    fix = f"set storage: {mounts[0]}/runs/{name} (or pass --set storage=... to bcrit sweep)"
    storage = data.get("storage")
    from orchestrator.storage.uri import is_uri  # not at the top: it loads pyarrow (bcrit --help loads this module)

    if isinstance(storage, str) and is_uri(storage):
        if data.get("kind") == "branched" or "branches" in data:
            raise UserError(f"{spec_path}: storage {storage} is a URI; a branched study needs a shared path: {fix}")
        return storage  # every node reaches a URI (bcrit sweep probes it before launch)
    if not isinstance(storage, str) or not storage.startswith("/"):
        where = "unset (./runs/<name>)" if storage is None else repr(storage)
        raise UserError(
            f"{spec_path}: storage is {where}, relative to wherever the driver starts, not a shared mount; {fix}"
        )
    norm = posixpath.normpath(storage)
    if not any(norm == m or norm.startswith(m.rstrip("/") + "/") for m in mounts):
        raise UserError(
            f"{spec_path}: storage {storage} is not on a mount every node shares ({', '.join(mounts)}): the GPU "
            f"nodes' checkpoints would fail; {fix}"
        )
    return storage


def storage_places(cfg: dict, specs: list[str]) -> dict[str, str]:
    """Per spec, where its storage is (``at a URI``, ``on the shared mount``), each checked by `check_spec_storage`."""
    from orchestrator.storage.uri import is_uri

    where = {spec: check_spec_storage(cfg, spec) for spec in specs}
    return {spec: "at a URI" if is_uri(s) else "on the shared mount" for spec, s in where.items()}


def load_config(path: str) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    try:
        cfg = yaml.safe_load(text)  # as `ray up` reads it (YAML 1.1), not as bcrit reads specs (yaml_overrides)
    except yaml.YAMLError as e:
        raise UserError(f"{path} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path} is not a Ray cluster config (expected a mapping at the top level)")
    return cfg


def check_config(cfg: dict, allow_world_ssh: bool = False) -> dict:
    """Raise UserError on the first violation; return ``{"groups", "cidrs", "world"}`` of a config that passes."""
    ray_validate(cfg)
    if (cfg.get("provider") or {}).get("type") != "aws":
        raise UserError("provider.type is not aws: check-cluster checks the AWS launcher's security groups only")
    groups = check_security_groups(cfg)
    cidrs, world = check_ingress(cfg, allow_world_ssh)
    check_loopback(cfg)
    return {"groups": groups, "cidrs": cidrs, "world": world}


def ray_validate(cfg: dict) -> dict:
    """The offline part of ``ray up``: Ray's fill-in and JSON-schema / cross-field validation."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    # prepare_config logs an INFO line ("setting max workers for head node type to 0") that is no news here.
    util_logger = logging.getLogger("ray.autoscaler._private.util")
    level = util_logger.level
    util_logger.setLevel(logging.WARNING)
    try:
        prepared = prepare_config(copy.deepcopy(cfg))
        validate_config(prepared)
    except Exception as e:  # noqa: BLE001 - jsonschema.ValidationError or ValueError, as `ray up` raises
        first = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"the config does not pass Ray's own validation: {first}") from None
    finally:
        util_logger.setLevel(level)
    return prepared


def check_security_groups(cfg: dict) -> list[str]:
    """Every node type's ``SecurityGroupIds``: set (else Ray creates a group with SSH from 0.0.0.0/0), real ids."""
    groups: list[str] = []
    for name, node_type in cfg["available_node_types"].items():
        key = f"available_node_types.{name}.node_config.SecurityGroupIds"
        ids = (node_type.get("node_config") or {}).get("SecurityGroupIds")
        if not ids:
            raise UserError(f"{key} is not set, so Ray would create a group with SSH from 0.0.0.0/0: {FIX_SG}")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise UserError(f"{key} must be a list of security group ids such as [sg-0123456789abcdef0]")
        for sg in ids:
            if PLACEHOLDER_RE.search(sg):
                raise UserError(f"{key} is still the placeholder {sg}: {FIX_SG}, then put its id there")
            if not SG_ID_RE.match(sg):
                raise UserError(f"{key}: {sg!r} is not a security group id (sg- and 8 or 17 hex digits)")
            if sg not in groups:
                groups.append(sg)
    return groups


def check_ingress(cfg: dict, allow_world_ssh: bool) -> tuple[list[str], bool]:
    """``provider.security_group.IpPermissions``: SSH only, from valid user-set CIDRs; the world only if allowed."""
    base = "provider.security_group.IpPermissions"
    rules = ((cfg.get("provider") or {}).get("security_group") or {}).get("IpPermissions")
    if not rules:
        raise UserError(f"{base} is not set: state the SSH rule of your security group (tcp 22 from your CIDR)")
    cidrs: list[str] = []
    world = False
    for i, rule in enumerate(rules):
        key = f"{base}[{i}]"
        if not isinstance(rule, dict):
            raise UserError(f"{key} is not a rule (IpProtocol, FromPort, ToPort, IpRanges)")
        if (str(rule.get("IpProtocol")), rule.get("FromPort"), rule.get("ToPort")) != ("tcp", SSH_PORT, SSH_PORT):
            raise UserError(
                f"{key} opens {rule.get('IpProtocol')} {rule.get('FromPort')}-{rule.get('ToPort')}: only SSH "
                "(tcp 22) may be opened; reach MLflow and the dashboard with `ray attach cluster.yaml -p 5000` and "
                "`ray dashboard cluster.yaml`"
            )
        if rule.get("UserIdGroupPairs") or rule.get("PrefixListIds"):
            raise UserError(f"{key}: only IpRanges / Ipv6Ranges (CIDRs) are checked; state the SSH sources as CIDRs")
        entries = [(f"{key}.IpRanges[{j}].CidrIp", r, "CidrIp") for j, r in enumerate(rule.get("IpRanges") or [])]
        entries += [
            (f"{key}.Ipv6Ranges[{j}].CidrIpv6", r, "CidrIpv6") for j, r in enumerate(rule.get("Ipv6Ranges") or [])
        ]
        if not entries:
            raise UserError(f"{key} has no IpRanges: set CidrIp to your network, e.g. 203.0.113.7/32")
        for where, entry, field in entries:
            net = _network(where, (entry or {}).get(field) if isinstance(entry, dict) else None)
            if net.prefixlen == 0:
                if not allow_world_ssh:
                    raise UserError(
                        f"{where} is {net}, SSH from the whole internet: set your own CIDR, or pass "
                        "--allow-world-ssh to accept it"
                    )
                world = True
            cidrs.append(str(net))
    return cidrs, world


def _network(key: str, value) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    if not isinstance(value, str) or not value:
        raise UserError(f"{key} is not set: put your network there, e.g. 203.0.113.7/32")
    if PLACEHOLDER_RE.search(value):
        raise UserError(f"{key} is still the placeholder {value}: put your network there, e.g. 203.0.113.7/32")
    if "/" not in value:
        raise UserError(f"{key}: {value!r} has no prefix length; write a CIDR such as {value}/32")
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError as e:
        try:  # host bits set: name the network the user probably meant
            hint = f"; the network is {ipaddress.ip_network(value, strict=False)}"
        except ValueError:
            hint = ""
        raise UserError(f"{key}: {value!r} is not a valid CIDR ({e}){hint}") from None


def check_loopback(cfg: dict) -> None:
    """MLflow servers and the Ray dashboard, wherever started, bound to loopback only."""
    for key, cmd in _commands(cfg):
        toks = tokens(cmd)
        for i in range(len(toks) - 1):
            if Path(toks[i]).name == "mlflow" and toks[i + 1] in ("server", "ui"):
                host = option(toks, i + 2, "--host", "-h")
                if host is not None and host not in LOOPBACK:
                    raise UserError(
                        f"{key}: mlflow {toks[i + 1]} --host {host}: bind it to 127.0.0.1 and reach it with "
                        "`ray attach cluster.yaml -p 5000`"
                    )
            if toks[i] == "ray" and toks[i + 1] == "start":
                dash = option(toks, i + 2, "--dashboard-host")
                if dash is not None and dash not in LOOPBACK:
                    raise UserError(
                        f"{key}: ray start --dashboard-host {dash}: use --dashboard-host=127.0.0.1 and reach it with "
                        "`ray dashboard cluster.yaml`"
                    )


def _commands(cfg: dict):
    for k in COMMAND_KEYS:
        for cmd in cfg.get(k) or []:
            yield k, cmd
    for name, node_type in (cfg.get("available_node_types") or {}).items():
        for k in ("initialization_commands", "worker_setup_commands"):
            for cmd in node_type.get(k) or []:
                yield f"available_node_types.{name}.{k}", cmd


def tokens(cmd: str) -> list[str]:
    """Shell words of ``cmd``, with operators glued to words (``disown;``) split off so option parsing stops there."""
    try:
        return shlex.split(cmd.replace(";", " ; "))
    except ValueError:
        return cmd.replace(";", " ; ").split()


def option(toks: list[str], start: int, *names: str) -> str | None:
    """Value of the first of ``names`` among the options after ``toks[start]``, up to the next shell operator."""
    for i in range(start, len(toks)):
        tok = toks[i]
        if tok in SHELL_OPS:
            break
        for name in names:
            if tok == name and i + 1 < len(toks):
                return toks[i + 1]
            if tok.startswith(name + "="):
                return tok.split("=", 1)[1]
    return None
