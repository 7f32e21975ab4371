"""Sweep results into DuckDB: one row per simulated run, one per cell of each run.

Tables `sim_results` and `sim_cell_usage` are created if missing and appended to in one
statement each (columns passed as lists and zipped by `unnest`), never row by row.
DuckDB allows one writer per file: pass the coordinator's open connection when there
is one, else a path (opened and closed here).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from gyre.sim.metrics import SimResult

RESULT_COLUMNS = {
    "sweep_id": "VARCHAR",
    "run_index": "INTEGER",
    "workload": "VARCHAR",
    "policy": "VARCHAR",
    "steps": "INTEGER",
    "seed": "INTEGER",
    "num_cells": "INTEGER",
    "cell_nodes": "INTEGER",
    "lookahead_groups": "INTEGER",
    "num_train_cells": "INTEGER",
    "target_staleness": "DOUBLE",
    "makespan_h": "DOUBLE",
    "mean_staleness": "DOUBLE",
    "lower_bound_h": "DOUBLE",
    "lower_bound_work_h": "DOUBLE",
    "lower_bound_critical_path_h": "DOUBLE",
    "lower_bound_room_h": "DOUBLE",
    "efficiency": "DOUBLE",
    "capacity_efficiency": "DOUBLE",
    "busy_h": "DOUBLE",
    "idle_h": "DOUBLE",
    "switching_h": "DOUBLE",
    "stalled_execution_h": "DOUBLE",
    "sim_wall_s": "DOUBLE",
}
CELL_COLUMNS = {
    "sweep_id": "VARCHAR",
    "run_index": "INTEGER",
    "cell_id": "INTEGER",
    "busy_h": "DOUBLE",
    "idle_h": "DOUBLE",
    "switching_h": "DOUBLE",
    "num_switches": "INTEGER",
}


def _insert(con: duckdb.DuckDBPyConnection, table: str, columns: dict[str, str], rows: list[dict]) -> None:
    con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(f'{c} {t}' for c, t in columns.items())})")
    for column, kind in columns.items():  # a file written before a column existed gains it (old rows: NULL)
        con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind}")
    if not rows:
        return
    selects = ", ".join(f"unnest(?::{t}[]) AS {c}" for c, t in columns.items())
    names = ", ".join(columns)
    con.execute(f"INSERT INTO {table} ({names}) SELECT {selects}", [[row[c] for row in rows] for c in columns])


def write(results: list[SimResult], db: duckdb.DuckDBPyConnection | str | Path, sweep_id: str = "") -> int:
    """Append `results`; returns the number of runs written."""
    con = duckdb.connect(str(db)) if isinstance(db, (str, Path)) else db
    try:
        start = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'sim_results'"
        ).fetchone()[0]
        offset = con.execute("SELECT count(*) FROM sim_results").fetchone()[0] if start else 0
        runs, cells = [], []
        for index, result in enumerate(results, start=offset):
            record = result.model_dump()
            runs.append({"sweep_id": sweep_id, "run_index": index, **{c: record.get(c) for c in RESULT_COLUMNS if c in record}})
            cells.extend({"sweep_id": sweep_id, "run_index": index, **cell} for cell in record["cells"])
        _insert(con, "sim_results", RESULT_COLUMNS, runs)
        _insert(con, "sim_cell_usage", CELL_COLUMNS, cells)
    finally:
        if isinstance(db, (str, Path)):
            con.close()
    return len(results)
