"""``report.html``: ``report.md`` as one self-contained HTML page, its PNG plots embedded as data URIs.

MLflow's artifact viewer shows a Markdown file as text (image links stay links) and an HTML file rendered, from
its content alone (relative image paths do not resolve there): embedding the images makes the report readable in
the MLflow UI and in any browser, with nothing beside it.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

HTML_FILE = "report.html"
_STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 1.5em auto; max-width: 70em;
       padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f3f3f3; }
code { background: #f3f3f3; padding: 0 0.2em; }
img { max-width: 100%; height: auto; display: block; margin: 1em 0; border: 1px solid #eee; }
"""


def _markdown(text: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def _embed_images(body: str, image_dir: Path) -> str:
    """``<img src="plot.png">`` of a PNG in ``image_dir`` -> a ``data:image/png;base64`` URI."""

    def sub(m: re.Match) -> str:
        name = html.unescape(m.group(1))
        path = image_dir / name
        if "/" in name or not name.endswith(".png") or not path.is_file():
            return m.group(0)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f'src="data:image/png;base64,{data}"'

    return re.sub(r'src="([^"]+)"', sub, body)


def render_html(markdown_text: str, image_dir: str | Path, title: str = "bcrit report") -> str:
    body = _embed_images(_markdown(markdown_text), Path(image_dir))
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head>\n<body>\n{body}</body></html>\n"
    )
