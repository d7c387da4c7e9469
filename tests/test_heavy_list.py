"""The `heavy` list (HEAVY in tests/conftest.py, docs/testing.md): an entry whose file or test function is gone
stops every pytest run, so a renamed heavy test can neither fall back into `make test` nor drop out of
`make test-heavy` unnoticed (as NUMERICS guards `make test-kernels`)."""

from __future__ import annotations

from tests.conftest import unlisted


def test_a_gone_file_or_test_function_is_reported(tmp_path):
    (tmp_path / "tests" / "x").mkdir(parents=True)
    source = "def test_one():\n    pass\n\n\ndef helper_test_two():\n    pass\n"  # test_two only inside a name
    (tmp_path / "tests" / "x" / "test_a.py").write_text(source)
    listed = {"x": "test_a.py test_a.py::test_one test_a.py::test_two test_gone.py test_gone.py::test_one"}
    assert unlisted(listed, tmp_path) == [
        "tests/x/test_a.py::test_two",
        "tests/x/test_gone.py",
        "tests/x/test_gone.py::test_one",
    ]
    assert unlisted({"x": "test_a.py test_a.py::test_one"}, tmp_path) == []
