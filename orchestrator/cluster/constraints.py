"""The pip constraints a cluster node installs bcrit under (cluster.yaml's setup_commands): the image's Ray and
the torch already there, pinned so that ``pip install -c ... -e .`` cannot replace either.

Pinned to the *distribution* version (``importlib.metadata.version``), which is what pip compares a constraint with,
not ``torch.__version__``: a CUDA wheel's ``__version__`` carries a local tag (``2.13.0+cu128``) that the installed
distribution's metadata need not carry, and a pin on it then matches no installed or installable distribution.
Standard library only: cluster.yaml runs it as a script before bcrit is installed
(``python /home/ray/bcrit/orchestrator/cluster/constraints.py > /tmp/bcrit-constraints.txt``).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

PINNED = ("ray", "torch")


def constraint_lines(version: Callable[[str], str] = metadata.version, packages: tuple[str, ...] = PINNED) -> list[str]:
    """``name==<distribution version>`` for each installed package of ``packages`` (one missing is not pinned)."""
    out = []
    for name in packages:
        try:
            out.append(f"{name}=={version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return out


if __name__ == "__main__":
    print("\n".join(constraint_lines()))
