"""What a run's DuckDB file says of each start of the run, and the verdict a finished start gets.

Every start of a run directory (the first, and each `--resume`) is one row of `runs`, `status`
`running` until the flow closes it: `completed`, `failed` (with `status_reason`), `stopped` (a stop
signal or a cancel), `suspended` (suspended through Prefect; resuming that flow run starts the flow
again, which finds its earlier start here, `started_before`, and continues the directory). A kill -9, an OOM kill or a power loss closes nothing: its row stays `running`.
DuckDB lets one process hold the file read-write, so a row still `running` in a file this process
could open belongs to a start that is gone: `settle` (and a resume, `crashed_starts`) records it
`crashed`. The Prefect side of the same facts is `gyre.flows.states`.

`verdict` is the rule that keeps a green "Completed" honest: a start that scored nothing, or whose
evaluator failures (dropped executions, never counted as zeros) exceed `evaluator.max_dropped_share`
of its executions, is `failed`, with the counts as its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb

CRASHED_REASON = "the process ended without closing the run (kill -9, out of memory, power loss)"


@dataclass(frozen=True)
class RunStart:
    """One start of a run (a row of `runs`)."""

    run_id: str
    status: str
    reason: str | None
    flow_run_id: str | None
    started_at: datetime | None


def crashed_starts(store, current_run_id: str | None = None) -> list[RunStart]:
    """Record `crashed` every start still `running` in `store` (an open `RunStore`, so no other process holds
    the file) other than `current_run_id`; returns them as they are now."""
    rows = store.query("SELECT run_id, prefect_flow_run_id, started_at FROM runs WHERE status = 'running' "
                       "AND run_id IS DISTINCT FROM ?", [current_run_id])
    if rows:
        store.query("UPDATE runs SET status = 'crashed', status_reason = ? WHERE status = 'running' "
                    "AND run_id IS DISTINCT FROM ?", [CRASHED_REASON, current_run_id])
    return [RunStart(run_id, "crashed", CRASHED_REASON, flow, started) for run_id, flow, started in rows]


def settle(run_dir: Path) -> list[RunStart]:
    """Every start of the run in `run_dir`, a dead `running` one recorded `crashed` first; [] when the run is
    live (another process holds its file) or `run_dir` holds no run. Read-only unless a start needs recording."""
    from gyre.storage.store import RunStore

    path = Path(run_dir) / "gyre.duckdb"
    if not path.is_file():
        return []
    try:
        starts = _read_starts(duckdb.connect(str(path), read_only=True))
    except duckdb.IOException:  # "Could not set lock on file": a live run holds it
        return []
    except duckdb.CatalogException:  # no `runs` table: a proxy's call record, not a run
        return []
    if not any(start.status == "running" for start in starts):
        return starts
    store = RunStore(path)  # read-write (and brought to this gyre's columns) only to record the dead
    try:
        dead = {start.run_id: start for start in crashed_starts(store)}
    finally:
        store.close()
    return [dead.get(start.run_id, start) for start in starts]


def _read_starts(con) -> list[RunStart]:
    """The starts in an open connection (closed here); a file from before `status_reason` reads it as None."""
    with con:
        columns = {row[0] for row in con.execute("DESCRIBE runs").fetchall()}
        reason = "status_reason" if "status_reason" in columns else "NULL"
        rows = con.execute(f"SELECT run_id, status, {reason}, prefect_flow_run_id, started_at FROM runs "
                           "ORDER BY started_at").fetchall()
    return [RunStart(*row) for row in rows]


def started_before(run_dir: Path, flow_run_id: str) -> bool:
    """Whether flow run `flow_run_id` already started a run in `run_dir` (it was suspended and resumed, or
    retried): its file holds a start of that flow run."""
    starts = settle(run_dir)
    return any(start.flow_run_id == str(flow_run_id) for start in starts)


def is_live(run_dir: Path) -> bool:
    """Whether another process holds the run's file (a run in progress)."""
    path = Path(run_dir) / "gyre.duckdb"
    if not path.is_file():
        return False
    try:
        duckdb.connect(str(path), read_only=True).close()
    except duckdb.IOException:
        return True
    return False


def verdict(executions: int, scored: int, max_dropped_share: float) -> tuple[str, str | None]:
    """`completed`, or `failed` with its reason: nothing scored, or more evaluations dropped than allowed."""
    if executions == 0:
        return "completed", None
    dropped = executions - scored
    if scored == 0:
        return "failed", f"scored nothing: all {executions} executions' evaluations failed (dropped)"
    if dropped / executions > max_dropped_share:
        return "failed", (f"dropped {dropped} of {executions} executions' evaluations ({dropped / executions:.0%}), "
                          f"more than evaluator.max_dropped_share {max_dropped_share:.0%}")
    return "completed", None


def start_counts(store, run_id: str) -> tuple[int, int]:
    """(executions, scored) recorded since the start `run_id` began (a resume counts its own)."""
    (executions, scored), = store.query(
        "SELECT count(*), count(*) FILTER (WHERE eval_status IN ('ok', 'tampering')) FROM executions "
        "WHERE started_at >= (SELECT started_at FROM runs WHERE run_id = ?)", [run_id])
    return executions, scored


def run_dirs(root: Path) -> list[Path]:
    """The run directories directly under `root` (each holds a `gyre.duckdb`), by name."""
    root = Path(root)
    return sorted(d for d in root.iterdir() if (d / "gyre.duckdb").is_file()) if root.is_dir() else []
