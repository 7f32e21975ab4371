"""How `gyre bench` commands print: one table of figures, or the figures as JSON; where a bench writes."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import typer
from rich.table import Table

from gyre.cli.common import console

JSON = typer.Option(False, "--json", help="Print the figures as JSON only.")


def _print_json(figures: dict) -> None:
    print(json.dumps(figures, indent=2))


def _print_figures(title: str, figures: dict, as_json: bool) -> None:
    if as_json:
        _print_json(figures)
        return
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)


def _out_dir(out: Path | None, kind: str) -> Path:
    return out or Path("runs") / f"{kind}-{datetime.now():%Y%m%d-%H%M%S}"
