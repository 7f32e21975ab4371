"""The report as one self-contained HTML page: the summary table and every plot inline.

The page must open anywhere it is copied (a mail, a ticket, a laptop without the run
directory), so it references nothing outside itself: the PNGs are embedded as base64 data
URIs, the style sheet is inline, there is no script and no external font or link. Every
text taken from the run is HTML-escaped.
"""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

from gyre.report.plots import Plot

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1250px; color: #212121; }
table.summary { border-collapse: collapse; margin-bottom: 2em; }
table.summary th, table.summary td { border: 1px solid #ccc; padding: 4px 10px; text-align: left;
  vertical-align: top; }
table.summary th { background: #f5f5f5; white-space: nowrap; }
figure { margin: 0 0 2.5em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #616161; font-size: 0.9em; }
nav a { margin-right: 1em; }
"""


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def render(title: str, rows: list[tuple[str, str]], plots: list[Plot]) -> str:
    summary = "\n".join(f"<tr><th>{escape(label)}</th><td>{escape(value)}</td></tr>" for label, value in rows)
    nav = " ".join(f'<a href="#{escape(p.name)}">{escape(p.title)}</a>' for p in plots)
    figures = "\n".join(
        f'<figure id="{escape(p.name)}"><h2>{escape(p.title)}</h2>'
        f'<img alt="{escape(p.title)}" src="{data_uri(p.path)}">'
        f"<figcaption>{escape(p.path.name)}: {escape(p.caption)}"
        + ("" if p.no_data is None else f" <b>No data</b>: {escape(p.no_data)}.")
        + "</figcaption></figure>"
        for p in plots
    )
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{escape(title)}</h1>\n<table class=\"summary\">\n{summary}\n</table>\n"
        f"<nav>{nav}</nav>\n{figures}\n</body>\n</html>\n"
    )


def write(path: Path, title: str, rows: list[tuple[str, str]], plots: list[Plot]) -> Path:
    """Write the page to `path` (written to a temporary name, then renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(title, rows, plots), encoding="utf-8")
    tmp.replace(path)
    return path
