from pathlib import Path

from analysis.core import metrics as M


def test_every_metric_constant_is_documented():
    names = {v for k, v in vars(M).items() if k.isupper() and isinstance(v, str) and "/" in v}
    assert names <= set(M.METRIC_DOCS) | set(M.PARENT_DOCS), names - set(M.METRIC_DOCS) - set(M.PARENT_DOCS)


def test_docs_metric_table_is_current():
    page = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    assert M.markdown_table() in page, "docs/metrics.md metric table is stale: paste `python -m analysis.core.metrics`"


def test_per_bin_names():
    assert M.per_bin(M.EVAL_LOSS_BIN, 3) == "eval/loss/bin3"
    assert M.per_bin(M.GNS_BIN_B_SIMPLE, 0) == "gns/bin0/b_simple"


def test_docs_tracking_table_is_current():
    page = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    table = M.markdown_table(M.TRACKING_DOCS)
    assert table in page, "docs/metrics.md MLflow table is stale: paste `python -m analysis.core.metrics --tracking`"
    assert set(M.TRACKING_DOCS) == set(M.TRACKING_ONLY) - {M.STEP}  # every tracking-only name documented


def test_docs_parent_table_is_current():
    page = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    table = M.markdown_table(M.PARENT_DOCS)
    assert table in page, "docs/metrics.md parent-run table is stale: paste `python -m analysis.core.metrics --parent`"
