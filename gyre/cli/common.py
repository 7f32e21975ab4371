"""What every `gyre` command shares: the consoles and the one way bad input ends a command."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.config.run import ConfigError
from gyre.engines.models.hf import ModelDirError

console = Console()
err_console = Console(stderr=True)

INPUT_ERRORS = (ConfigError, ModelDirError, BenchmarkFormatError, FileNotFoundError, FileExistsError)


def _fail(exc: Exception, code: int = 2) -> None:
    """One-line error naming what is wrong, exit code `code` (2: bad input)."""
    err_console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)  # one line, however long
    raise typer.Exit(code=code)
