"""`gyre sql RUN_DIR "select ..."`: a query against a run's DuckDB file, finished or live.

A finished run's `gyre.duckdb` is opened read-only. While a run is live its process holds
DuckDB's lock on that file, so the query runs on `RUN_DIR/live.duckdb` instead, the copy the
run refreshes after every step and evaluation round (`gyre.storage.live_export`), and the command
says so, with the copy's age. Output: a rich table, or with `--json` one JSON document
`{"source", "age_s", "columns", "rows"}` (`age_s` null for the run file itself; values as
JSON types, timestamps and other non-JSON values as strings). Exit code 2 when RUN_DIR holds
no run, the run is live and has no copy yet, or the SQL is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from gyre.cli.common import _fail, console, err_console, print_table
from gyre.storage.live_export import open_read_only

DB_FILE = "gyre.duckdb"


def _open(run_dir: Path):
    """A read-only connection and where it reads: the run file, else the live copy (with its age)."""
    path = run_dir / DB_FILE
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no {DB_FILE} (not a run directory)")
    return open_read_only(path)


def _plain(value):
    return value if value is None or isinstance(value, (bool, int, float, str, list)) else str(value)


def sql(
    run_dir: Path = typer.Argument(..., help="A run directory (holds gyre.duckdb).", metavar="RUN_DIR"),
    query: str = typer.Argument(..., help='SQL, e.g. "select step, reward_mean from steps order by step".'),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (source, age_s, columns, rows)."),
) -> None:
    """Query a run's DuckDB file read-only; during a live run, its latest copy (live.duckdb)."""
    import duckdb

    try:
        con, source, age_s = _open(run_dir)
    except (FileNotFoundError, duckdb.IOException) as exc:
        _fail(exc)
    try:
        try:
            cursor = con.execute(query)
        except duckdb.Error as exc:
            _fail(exc)
        columns = [d[0] for d in cursor.description or []]
        rows = cursor.fetchall() if columns else []
    finally:
        con.close()
    if as_json:
        print(json.dumps({"source": str(source), "age_s": age_s, "columns": columns,
                          "rows": [[_plain(v) for v in row] for row in rows]}, default=str))
        return
    if age_s is not None:
        err_console.print(f"live run: reading {source}, the copy written {age_s:.0f} s ago (after its last step "
                          "or evaluation round)", markup=False, soft_wrap=True)
    table = Table(title=escape(str(source)))
    for col in columns:
        table.add_column(escape(col))
    for row in rows:
        table.add_row(*("NULL" if v is None else escape(str(v)) for v in row))
    print_table(table, console)
