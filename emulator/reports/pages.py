"""The building blocks of the HTML pages (the run report and the sweep report): one
self-contained page with its style, sections, tables and embedded PNG figures.

    from emulator.reports.pages import html_page, section, table
    html_page("Title", section("Numbers", table([["1", "2"]], ["a", "b"])))
"""

from __future__ import annotations

import base64
import html

STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1250px} table{border-collapse:collapse;margin:1em 0} "
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left} td.n{text-align:right} img{max-width:100%} "
    "pre{background:#f6f6f6;padding:1em} .failed{background:#fde2e1;border:1px solid #c44e52;padding:1em} "
    ".note{color:#555;font-size:90%}"
)


def table(rows: list[list[str]], header: list[str]) -> str:
    """An HTML table of already formatted cells; cells that start with a digit are right-aligned."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)

    def cell(text: str) -> str:
        numeric = text.lstrip("+-")[:1].isdigit()
        return f'<td class="n">{html.escape(text)}</td>' if numeric else f"<td>{html.escape(text)}</td>"

    body = "".join("<tr>" + "".join(cell(str(v)) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def image(name: str, pngs: dict[str, bytes]) -> str:
    png = pngs.get(name)
    if png is None:
        return ""
    return f'<img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def section(title: str, body: str) -> str:
    return f"<h2>{html.escape(title)}</h2>\n{body}\n"


def html_page(title: str, body: str) -> str:
    """A self-contained page: ``title`` (plain text) as its title and heading, ``body`` (HTML)."""
    title = html.escape(title)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>{STYLE}</style>
</head><body><h1>{title}</h1>
{body}</body></html>
"""
