"""What every `gyre` command shares: the consoles, the one way bad input ends a command, and tables printed
whole (`print_table`)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.config.run import ConfigError
from gyre.engines.models.hf import ModelDirError

def _flags_take_no_value() -> None:
    """typer 0.29's help labels every boolean flag with a type, as if it took a value (`--resume <bool>`); a flag
    takes none, so its type column stays empty, as click's own help has it. (One method of typer's option
    class, replaced once at import; every other option keeps typer's label.)"""
    from typer.core import TyperOption

    label = TyperOption.display_type_rich
    if getattr(label, "gyre_flags_take_no_value", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag and not self.count else label(self, ctx)

    display_type_rich.gyre_flags_take_no_value = True
    TyperOption.display_type_rich = display_type_rich


_flags_take_no_value()
console = Console()
err_console = Console(stderr=True)

UNBOUNDED_WIDTH = 100_000
"""The width a table is measured in off a terminal: wide enough for any row."""
INPUT_ERRORS = (ConfigError, ModelDirError, BenchmarkFormatError, FileNotFoundError, FileExistsError)


def _fail(exc: Exception, code: int = 2) -> None:
    """One-line error naming what is wrong, exit code `code` (2: bad input)."""
    err_console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)  # one line, however long
    raise typer.Exit(code=code)


def print_table(table, out: Console | None = None) -> None:
    """Print a rich table whole. On a terminal rich fits it to the window; off one (a file, a pipe, a CI log) rich
    takes 80 columns and cuts cells to fit (`.../dep-e…`), so the console is widened to the table's own width
    there: every row whole, however wide."""
    out = out or console
    if not out.is_terminal:
        from rich.measure import Measurement

        natural = Measurement.get(out, out.options.update_width(UNBOUNDED_WIDTH), table).maximum
        out.width = max(out.width, natural)
    out.print(table)
