"""`bcrit train`: user mistakes give one line and exit code 2, before any compute."""

import pytest

from orchestrator.cli.main import main


@pytest.mark.parametrize(
    "content, sets, needle",
    [
        ("batch_size: 30\nmicro_batch_size: 8\n", [], "not divisible by micro_batch_size"),
        ("preset: DiT-Z/9\n", [], "unknown preset"),
        ("learning_rate: 1.0\n", [], "unknown config key"),
        ("dataset: /no/such/folder\n", [], "neither 'digits' nor"),
        ("batch_size: 64\n", ["num_workers=64", "micro_batch_size=1"], "CPUs"),
        ("batch_size: [1, 2\n", [], "not valid YAML"),
        ("preset: tiny\n", ["lr"], "expected key=value"),
        ("compile: maybe\n", [], "'compile' must be bool"),
    ],
)
def test_bad_config_one_line_exit_2(tmp_path, capsys, content, sets, needle):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(content)
    argv = ["train", str(cfg)] + [a for s in sets for a in ("--set", s)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and err.startswith("bcrit train: error:")
    assert "\n" not in err and "Traceback" not in err


def test_missing_config_file(capsys):
    assert main(["train", "/no/such.yaml"]) == 2
    assert "no such file" in capsys.readouterr().err
