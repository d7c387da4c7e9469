"""Side by side: finished sweep directories (a grid and what replaces it) at the same targets (issue 30).

For each directory: its trials, the examples they processed (the sum of ``trials.parquet``'s ``examples``, what
``bcrit`` records per trial), and from its analysis (``DIR/analysis/bcrit.json``, written by ``bcrit analyze DIR
--targets ...``) B_crit with its 90% interval, the relative half-width ``(hi - lo) / (2 B_crit)`` and the flags at
each target; ratios are to the first directory of its group (``--group`` separates the repeats).

Run: PYTHONPATH=. .venv/bin/python benchmarks/compare_sweeps.py --targets 0.2097 0.1802 \
         --group /tmp/b30/grid0 /tmp/b30/adapt0 --group /tmp/b30/grid1 /tmp/b30/adapt1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow.parquet as pq


def summary(d: Path, targets: list[float]) -> dict:
    trials = pq.read_table(d / "trials.parquet").to_pydict()
    out = {"dir": str(d), "trials": len(trials["trial_id"]), "examples": float(sum(x or 0 for x in trials["examples"]))}
    rep = json.loads((d / "analysis" / "bcrit.json").read_text())
    by = {round(t["target"], 6): t for t in rep["targets"]}
    for y in targets:
        t = by.get(round(y, 6))
        if t is None or t["b_crit_ci"][0] is None:
            out[y] = None
            continue
        lo, hi = t["b_crit_ci"]
        out[y] = {
            "b_crit": t["b_crit"],
            "lo": lo,
            "hi": hi,
            "width": (hi - lo) / (2 * t["b_crit"]),
            "flags": t["flags"],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", type=float, nargs="+", required=True)
    ap.add_argument("--group", nargs="+", action="append", required=True, help="sweep dirs; the first is the reference")
    a = ap.parse_args()
    head = " | ".join(f"B_crit at {y:g} [90%] | rel. half-width" for y in a.targets)
    print(f"| sweep | trials | examples | examples / first | {head} |")
    print("|---|---:|---:|---:|" + "---|---:|" * len(a.targets))
    for group in a.group:
        rows = [summary(Path(d), a.targets) for d in group]
        for r in rows:
            cells = []
            for y in a.targets:
                t = r[y]
                if t is None:
                    cells += ["-", "-"]
                    continue
                flags = f" ({', '.join(t['flags'])})" if t["flags"] else ""
                cells += [f"{t['b_crit']:.1f} [{t['lo']:.1f}, {t['hi']:.1f}]{flags}", f"{t['width']:.3f}"]
            print(
                f"| {r['dir']} | {r['trials']} | {r['examples']:,.0f} | {r['examples'] / rows[0]['examples']:.2f} | "
                + " | ".join(cells)
                + " |"
            )


if __name__ == "__main__":
    main()
