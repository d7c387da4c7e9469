"""``bcrit schedule``: the proposal printed and written from an analysis, a trial config that accepts it, and bad
input as one line with exit code 2."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli.main import main
from trainables.nqm_trial import QuadraticConfig

SIZES = [8, 16, 32, 64, 128, 256, 512, 1024]


def analysis(tmp_path, s_min=(3.0, 7.0, 9.0), e_min=(30.0, 430.0, 2430.0)) -> str:
    """A bcrit.json: three targets whose B_local grows 10 -> 100 -> 1000; lr 0.001 x B (B=8 misses the last)."""
    targets = []
    for y, s, e in zip((1.0, 0.5, 0.2), s_min, e_min, strict=True):
        sizes = SIZES if y > 0.2 else SIZES[1:]
        points = [{"batch_size": b, "steps": s + e / b, "lr": 0.001 * b} for b in sizes]
        targets.append({"target": y, "s_min": s, "e_min": e, "points": points})
    path = tmp_path / "bcrit.json"
    path.write_text(json.dumps({"metric": "eval/loss", "targets": targets, "bands": []}))
    return str(path)


def test_schedule_prints_and_writes_a_proposal_a_trial_accepts(tmp_path, capsys):
    out = tmp_path / "schedule.json"  # beside the bcrit.json given
    assert main(["schedule", analysis(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "proposal: batch_size" in text and "fewer steps" in text
    got = json.loads(out.read_text())
    trial, sched, ref = got["trial"], got["schedule"], got["reference"]
    assert ref["plan"] == "constant 256"  # nearest Σ ΔE_min / Σ ΔS_min = 2430 / 9 = 270
    assert sched["examples"] <= ref["examples"] and sched["steps"] < ref["steps"]
    assert trial["batch_schedule"] and trial["lr"] == pytest.approx(0.001 * trial["batch_size"])
    assert [e[2] for e in trial["batch_schedule"]] == pytest.approx([0.001 * e[1] for e in trial["batch_schedule"]])
    cfg = QuadraticConfig(batch_size=trial["batch_size"], micro_batch_size=8, lr=trial["lr"],
                          batch_schedule=trial["batch_schedule"])  # fmt: skip
    assert cfg.stages.sizes == tuple(dict.fromkeys(s["batch_size"] for s in got["segments"]))
    assert [s["batch_size"] for s in got["segments"]] == sorted(s["batch_size"] for s in got["segments"])


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--reference", "100"], "--reference 100 is not among the batch sizes"),
        (["--batch-sizes", "8,x"], "--batch-sizes must be comma-separated integers"),
    ],
)
def test_bad_flags_are_one_line_exit_2(tmp_path, capsys, argv, words):
    assert main(["schedule", analysis(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_missing_or_unusable_analysis_is_one_line_exit_2(tmp_path, capsys):
    assert main(["schedule", str(tmp_path)]) == 2
    assert "run `bcrit analyze" in capsys.readouterr().err
    bad = analysis(tmp_path, s_min=(-1.0, -2.0, -3.0))
    assert main(["schedule", bad]) == 2
    assert "no target has a usable fit" in capsys.readouterr().err


def test_seconds_come_from_the_median_throughput_per_batch_size(tmp_path, capsys):
    """A sweep directory with sys/examples_per_s rows: the proposal's seconds are examples / median throughput."""
    from analysis.core import metrics as M
    from orchestrator.features.schedule.schedule_plan import throughput_per_batch
    from orchestrator.records.runs_tables import RunsTables, trial_row

    tables = RunsTables(str(tmp_path))
    for i, (b, rates) in enumerate([(b, [100.0 * b, 300.0 * b, 250.0 * b]) for b in SIZES]):
        tid = f"t{i}"
        cfg = {"batch_size": b, "micro_batch_size": 8, "num_workers": 0, "lr": 0.01}
        tables.add_rows(
            tid, [[10 * (j + 1), 10 * (j + 1) * b, M.SYS_EXAMPLES_PER_S, r, 1.0, 0.0] for j, r in enumerate(rates)]
        )
        tables.write_trial(trial_row(tid, cfg, M.STATUS_BUDGET_SPENT))
    tables.compact()
    assert throughput_per_batch(str(tmp_path)) == {b: 250.0 * b for b in SIZES}  # the median, not the mean
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "bcrit.json").write_text(open(analysis(tmp_path)).read())
    out = tmp_path / "analysis" / "schedule.json"
    assert main(["schedule", str(tmp_path)]) == 0
    got = json.loads(out.read_text())
    # examples / (250 B) = steps / 250 at every batch size
    for row in (got["schedule"], got["reference"], *got["constants"]):
        assert row["seconds"] == pytest.approx(row["steps"] / 250.0, rel=1e-9)


def test_recommend_states_the_schedule_in_one_line(tmp_path):
    """`bcrit recommend`'s schedule line is the `bcrit schedule` proposal (same stages, same predicted savings), a
    'none proposed' line where the batch need not grow, and says why where nothing can be proposed."""
    from orchestrator.cli.recommend_cmd import schedule_line

    sweep = tmp_path / "sweep"
    (sweep / "analysis").mkdir(parents=True)
    analysis(sweep / "analysis")
    assert main(["schedule", str(sweep), "--out", str(tmp_path)]) == 0
    got = json.loads((tmp_path / "schedule.json").read_text())
    line = schedule_line(str(sweep))
    saved = 100 * (1 - got["schedule"]["steps"] / got["reference"]["steps"])
    assert f"batch_schedule {got['trial']['batch_schedule']}" in line and f"{saved:.0f}% fewer steps" in line
    flat = tmp_path / "flat"
    (flat / "analysis").mkdir(parents=True)
    analysis(flat / "analysis", s_min=(3.0, 6.0, 9.0), e_min=(30.0, 60.0, 90.0))  # B_local 10 in every segment
    assert "none proposed" in schedule_line(str(flat))
    assert "not proposed" in schedule_line(str(tmp_path / "nothing"))


def test_a_schedule_on_flagged_targets_says_so_first(tmp_path, capsys):
    path = analysis(tmp_path)
    assert main(["schedule", path]) == 0
    assert not capsys.readouterr().out.startswith("UNTRUSTED")
    got = json.loads((tmp_path / "schedule.json").read_text())
    assert got["warning"] is None and got["flags"] == {"1": [], "0.5": [], "0.2": []}
    res = json.loads(open(path).read())
    res["targets"][2]["flags"] = ["extrapolated", "near_floor"]  # what bcrit analyze would have said of 0.2
    open(path, "w").write(json.dumps(res))
    assert main(["schedule", path]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("UNTRUSTED: this schedule") and "0.2: extrapolated, near_floor" in first
    got = json.loads((tmp_path / "schedule.json").read_text())
    assert got["warning"] == first and got["flags"]["0.2"] == ["extrapolated", "near_floor"]
