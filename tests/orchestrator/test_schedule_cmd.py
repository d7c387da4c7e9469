"""``bcrit schedule``: the proposal printed and written from an analysis, a trial config that accepts it, and bad
input as one line with exit code 2."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
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
    out = tmp_path / "proposal.json"
    assert main(["schedule", analysis(tmp_path), "--json", str(out)]) == 0
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
