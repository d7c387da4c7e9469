"""Mutation score per module from mutmut's cached results (`make mutate` prints it; docs/testing.md records it).

score = killed / (mutants - equivalent - not run), where "killed" includes timeouts and "equivalent" are the
surviving mutants judged to behave exactly like the original, listed with a reason in ``tests/mutants_equivalent.txt``
(``name  # reason`` per line). Run from the repository root: ``python -m tests.mutation_scores [--survivors]``.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

EQUIVALENT_FILE = Path(__file__).with_name("mutants_equivalent.txt")
KILLED = {"killed", "timeout", "caught by type check"}
NOT_RUN = {"not checked", "skipped"}


def module_of(mutant: str) -> str:
    """``analysis.core.bins.x_bin_of__mutmut_3`` / ``analysis.core.gns.xǁGNSEmaǁupdate__mutmut_1`` ->
    ``analysis.core.bins``."""
    return re.split(r"\.x[_ǁ]", mutant, maxsplit=1)[0]


def equivalent() -> set[str]:
    if not EQUIVALENT_FILE.exists():
        return set()
    lines = (line.split("#", 1)[0].strip() for line in EQUIVALENT_FILE.read_text().splitlines())
    return {line for line in lines if line}


def results() -> dict[str, str]:
    out = subprocess.run(
        [str(Path(sys.executable).with_name("mutmut")), "results", "--all", "true"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pairs = (line.strip().rsplit(": ", 1) for line in out.splitlines() if "__mutmut_" in line)
    return {name: status for name, status in pairs}


def main(argv: list[str]) -> int:
    res, equiv = results(), equivalent()
    by_module: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    survivors = []
    for name, status in res.items():
        kind = "equivalent" if name in equiv and status not in KILLED | NOT_RUN else status
        kind = "killed" if kind in KILLED else "not run" if kind in NOT_RUN else kind
        by_module[module_of(name)][kind] += 1
        if kind not in ("killed", "equivalent", "not run"):
            survivors.append(f"{name}: {kind}")
    print(f"{'module':28} {'mutants':>7} {'killed':>6} {'equiv':>5} {'other':>5} {'not run':>7} {'score':>6}")
    for module in sorted(by_module):
        c = by_module[module]
        total = sum(c.values())
        judged = total - c["equivalent"] - c["not run"]
        other = judged - c["killed"]
        score = f"{100 * c['killed'] / judged:.0f}%" if judged else "-"
        print(f"{module:28} {total:7} {c['killed']:6} {c['equivalent']:5} {other:5} {c['not run']:7} {score:>6}")
    if "--survivors" in argv:
        print("\n".join(["", "surviving (not judged equivalent):", *sorted(survivors)]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
