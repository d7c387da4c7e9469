"""An analysis where MLflow users look: on the sweep's parent run, after ``bcrit analyze``.

- every file of the output directory as an artifact under ``analysis/`` (``report.html`` renders in the artifact
  viewer with its plots embedded; the PNGs render on their own);
- the headline per target as **metrics** (targets with no flags only, i.e. the trustworthy ones):
  ``b_crit/<target>``, ``b_crit_lo/<target>``, ``b_crit_hi/<target>``, ``s_min/<target>``, ``e_min/<target>``,
  and the same per timestep bin prefixed ``bin<k>/``, and for the answer's bins (analysis.fits.answer: each bin at the
  point of training where the global loss reaches the answer's target) prefixed ``answer/bin<k>/``;
- the headline as an **MLflow table** (``log_table``: the UI renders it), every target with its ``flags``;
- the report's first lines (title, source, the B_crit table) as the run's **description**.

Re-running ``bcrit analyze`` replaces the table and the description; metrics get their new values (a target no
longer analysed keeps its old metric: MLflow cannot delete metrics).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

from analysis.reporting.report import REPORT_FILE

TABLE_FILE = "analysis/headline.json"
ARTIFACT_DIR = "analysis"
DESCRIPTION_TAG = "mlflow.note.content"
HEADLINE_KEYS = ("b_crit", "b_crit_lo", "b_crit_hi", "s_min", "e_min")


def target_key(target: float) -> str:
    """A target as a metric-name suffix (MLflow allows ``[A-Za-z0-9_./ :-]``): ``0.22``, ``0.2212``, ``1e-05``."""
    return f"{float(target):.4g}".replace("+", "")


def _entries(result: dict):
    """``(scope, prefix, timesteps, target entry)`` for the global targets, then each bin's."""
    for t in result.get("targets", []):
        yield "global", "", None, t
    for b in result.get("bins", []):
        for t in b.get("targets", []):
            yield f"bin {b['bin']}", f"bin{b['bin']}/", b.get("timesteps"), t
    for b in (result.get("answer") or {}).get("bins", []):  # each bin where the global loss reaches at_target
        if b.get("entry") is not None:
            yield f"bin {b['bin']} (answer)", f"answer/bin{b['bin']}/", b.get("timesteps"), b["entry"]


def _finite(x) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def headline_values(t: dict) -> dict[str, float | None]:
    lo, hi = (list(t.get("b_crit_ci") or []) + [None, None])[:2]
    return {
        "b_crit": _finite(t.get("b_crit")),
        "b_crit_lo": _finite(lo),
        "b_crit_hi": _finite(hi),
        "s_min": _finite(t.get("s_min")),
        "e_min": _finite(t.get("e_min")),
    }


def headline_metrics(result: dict) -> dict[str, float]:
    """Metric name -> value for every unflagged target (global and per bin); flagged targets are left out."""
    out: dict[str, float] = {}
    for _scope, prefix, _ts, t in _entries(result):
        if t.get("flags", []):
            continue
        for k, v in headline_values(t).items():
            if v is not None:
                out[f"{prefix}{k}/{target_key(t['target'])}"] = v
    return out


def headline_table(result: dict) -> dict[str, list]:
    """Columns of the headline table: every target, global and per bin, with its flags (empty = trustworthy)."""
    gns_keys = ("b_simple", "b_simple_se")
    keys = ("scope", "timesteps", "target", *HEADLINE_KEYS, "flags", "batch_sizes", "censored", *gns_keys)
    cols: dict[str, list] = {k: [] for k in keys}
    for scope, _prefix, ts, t in _entries(result):
        cols["scope"].append(scope)
        cols["timesteps"].append("" if ts is None else f"{ts[0]}-{ts[1]}")
        cols["target"].append(float(t["target"]))
        for k, v in headline_values(t).items():
            cols[k].append(v)
        cols["flags"].append(", ".join(t.get("flags", [])))
        cols["batch_sizes"].append(len(t.get("points", [])))
        cols["censored"].append(len(t.get("censored", [])))
        cols["b_simple"].append(_finite(t.get("b_simple")))
        cols["b_simple_se"].append(_finite(t.get("b_simple_se")))
    return cols


def description(report_md: str, result: dict) -> str:
    """The report's first lines (up to the end of the B_crit table) and where the rest is."""
    lines = report_md.splitlines()
    end = len(lines)
    seen_table = False
    for i, line in enumerate(lines):
        if line.startswith("|"):
            seen_table = True
        elif seen_table:
            end = i
            break
    flagged = sum(1 for *_x, t in _entries(result) if t.get("flags", []))
    tail = [
        "",
        "Full report with plots: artifact `analysis/report.html`; every target (global and per timestep bin) with "
        "its flags: `analysis/headline.json`.",
    ]
    if flagged:
        tail.append(f"{flagged} flagged target(s) are in the table but not in the metrics.")
    return "\n".join(lines[:end] + tail)


def log_analysis(out_dir: str | Path, tracking_uri: str | None, parent_run_id: str) -> None:
    """Log the analysis in ``out_dir`` (``bcrit.json``, ``report.md``, plots) to the sweep's parent run."""
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    out = Path(out_dir)
    client = MlflowClient(tracking_uri)
    result = json.loads((out / "bcrit.json").read_text())
    client.log_artifacts(parent_run_id, str(out), artifact_path=ARTIFACT_DIR)
    report_md = (out / REPORT_FILE).read_text() if (out / REPORT_FILE).exists() else ""
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0) for k, v in headline_metrics(result).items()]
    tags = [RunTag(DESCRIPTION_TAG, description(report_md, result))]
    for i in range(0, max(len(metrics), 1), 1000):
        client.log_batch(parent_run_id, metrics=metrics[i : i + 1000], tags=tags if i == 0 else [])
    table = headline_table(result)
    if table["target"]:
        _replace_table(client, parent_run_id, table)


def _replace_table(client, run_id: str, columns: dict[str, list], table_file: str = TABLE_FILE) -> None:
    """Write the table as MLflow's table artifact (the ``split`` JSON that ``log_table`` writes) and register it
    in the run's ``mlflow.loggedArtifacts`` tag, so the UI renders it. Not ``log_table`` itself: it appends to an
    existing table by downloading and re-uploading it, which both doubles rows on a re-run and races with a
    concurrent ``bcrit analyze`` of the same sweep (one reads the file while the other rewrites it)."""
    import pandas as pd
    from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, os.path.basename(table_file))
        pd.DataFrame(columns).to_json(path, orient="split", index=False, date_format="iso")
        client.log_artifact(run_id, path, os.path.dirname(table_file))
    from mlflow.exceptions import MlflowException

    entry = {"path": table_file, "type": "table"}
    for attempt in range(3):  # two analyses of one sweep at once may both find the tag missing and both insert it
        logged = json.loads(client.get_run(run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
        if entry in logged:
            return
        try:
            client.set_tag(run_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps([*logged, entry]))
            return
        except MlflowException:  # SQLite: UNIQUE constraint failed (the other one inserted it first): read again
            if attempt == 2:
                raise


RECOMMEND_TABLE = "analysis/recommend_table.json"


def log_recommendation(out_dir: str | Path, tracking_uri: str | None, parent_run_id: str, rec: dict) -> None:
    """``bcrit recommend``'s files (``recommend.json``, its figure, the updated report) as artifacts under
    ``analysis/``, the fastest and cheapest as metrics ``recommend/<fastest|cheapest>/<time_s|cost_hours|...>/<target>``
    and every candidate as the MLflow table ``analysis/recommend_table.json``; the target's trust flags as the tag
    ``recommend/flags/<target>`` (comma-separated, empty when trusted)."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    out = Path(out_dir)
    for name in ("recommend.json", "recommend.png", "recommend.md", REPORT_FILE, "report.html"):
        if (out / name).is_file():
            client.log_artifact(parent_run_id, str(out / name), ARTIFACT_DIR)
    now, key = int(time.time() * 1000), target_key(rec["target"])
    metrics = []
    for role in ("fastest", "cheapest"):
        row = rec["candidates"][rec[role]]
        for k in ("time_s", "cost_hours", "batch_size", "micro_batch_size", "grad_accum", "num_workers"):
            v = _finite(row[k])
            if v is not None:
                metrics.append(Metric(f"recommend/{role}/{k}/{key}", v, now, 0))
    client.log_batch(parent_run_id, metrics=metrics)
    # the analysis's trust flags at this target (analysis.reporting.trust_note): "" when trusted
    client.set_tag(parent_run_id, f"recommend/flags/{key}", ",".join(rec.get("flags") or []))
    cols: dict[str, list] = {}
    for i, row in enumerate(rec["candidates"]):
        row = {**row, "role": _role(rec, i)}
        for k, v in row.items():
            cols.setdefault(k, []).append(json.dumps(v) if isinstance(v, list) else v)
    _replace_table(client, parent_run_id, cols, RECOMMEND_TABLE)


def _role(rec: dict, i: int) -> str:
    roles = [r for r in ("fastest", "cheapest") if rec[r] == i] or (["front"] if i in rec["front"] else [])
    return " + ".join(roles)
