"""The documentation cannot drift: every relative link resolves to a file, the generated tables are the code's own,
the README stays one screen and a half, and every page in docs/ is reachable from it."""

import re
from pathlib import Path

import pytest

from analysis.core import metrics as M
from analysis.fits import flags

CHECKOUT = Path(__file__).resolve().parents[1]
README = CHECKOUT / "README.md"
README_MAX_LINES = 110  # a front page: detail goes to docs/, dated figures to benchmarks/RESULTS.md

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title"), ![img](target)
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)  # [label]: target
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, https:, mailto: ... (not checked: no network)


def doc_files() -> list[Path]:
    return [README, CHECKOUT / "CHANGELOG.md", *sorted((CHECKOUT / "docs").glob("*.md"))]


def relative_links(markdown: str) -> list[str]:
    """Targets of the Markdown links and images in ``markdown`` that point into the checkout (code blocks, code
    spans and HTML comments are not links)."""
    prose = CODE_SPAN.sub("", COMMENT.sub("", FENCE.sub("", markdown)))
    targets = INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)
    return [t for t in targets if not SCHEME.match(t)]


def link_problems(doc: Path) -> list[str]:
    """One line per relative link of ``doc`` that has an anchor or does not resolve to an existing file."""
    problems = []
    for target in relative_links(doc.read_text()):
        where = f"{doc.relative_to(CHECKOUT) if doc.is_relative_to(CHECKOUT) else doc.name}: ({target})"
        if "#" in target:
            problems.append(f"{where}: link to the file, not a section anchor (anchors break when headings change)")
        elif not (doc.parent / target).resolve().is_file():
            problems.append(f"{where}: no such file")
    return problems


def markdown_tables(markdown: str) -> list[str]:
    """Every table of ``markdown``: maximal runs of lines that start with ``|``."""
    tables, run = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            run.append(line)
        elif run:
            tables.append("\n".join(run))
            run = []
    return tables


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: p.name)
def test_every_relative_link_resolves_to_a_file(doc):
    assert not link_problems(doc), "\n".join(link_problems(doc))


def test_a_broken_link_is_caught(tmp_path):
    (tmp_path / "there.md").write_text("x")
    doc = tmp_path / "page.md"
    doc.write_text(
        "[ok](there.md) ![img](there.md) [web](https://example.org/missing) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n<!-- [comment](missing.md) -->\n"
        "[gone](missing.md) [anchored](there.md#section) [self](#top)\n[ref]: also-missing.md\n"
    )
    problems = link_problems(doc)
    assert [p.split(": ")[1] for p in problems] == ["(missing.md)", "(there.md#section)", "(#top)", "(also-missing.md)"]


@pytest.mark.parametrize(
    ("page", "table", "command"),
    [
        ("docs/metrics.md", M.markdown_table(), "python -m analysis.core.metrics"),
        ("docs/metrics.md", M.markdown_table(M.TRACKING_DOCS), "python -m analysis.core.metrics --tracking"),
        ("docs/analysis.md", flags.markdown_table(), "python -m analysis.fits.flags"),
    ],
    ids=["metrics", "tracking", "flags"],
)
def test_generated_tables_are_the_codes_own(page, table, command):
    """The table is one whole table of the page, not merely contained in a longer one (an extra row fails)."""
    assert table in markdown_tables((CHECKOUT / page).read_text()), f"{page}: table is stale: paste `{command}`"


def test_markdown_tables_split_on_blank_lines():
    text = "intro\n| a |\n| --- |\n| 1 |\n\n| b |\n| 2 |\nend"
    assert markdown_tables(text) == ["| a |\n| --- |\n| 1 |", "| b |\n| 2 |"]


def test_readme_is_one_screen_and_a_half():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t).resolve() for t in relative_links(README.read_text())}
    unlinked = [p.name for p in sorted((CHECKOUT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README's manual list does not link: {unlinked}"
