"""`gyre runs [ROOT]`: every run directory under ROOT (default `runs/`), what each start of it came to;
`gyre resume RUN_DIR`: resume a run suspended through Prefect.

A start of a run is one row of the run file's `runs` table (the first start, then each `--resume`).
Listing them is the "next contact" after a run was killed outright: a start still `running` in a
file no live process holds is recorded `crashed` (`gyre.runtime.run_status.settle`), and, when
`PREFECT_API_URL` names a Prefect server, its flow run and open task runs are marked Crashed there
(`gyre.flows.states.mark_starts`; without one, gyre's own server does it when the next `gyre run`
starts it). A live run is listed as live and left alone. Text, or one JSON document with `--json`:
`{"runs": [{"run_dir", "live", "starts": [{"run_id", "status", "reason", "flow_run_id", "started_at"}]}],
"prefect": [{"run_dir", "flow_run_id", "state"}] | null}`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from gyre.cli.common import _fail, console, print_table


def runs(
    root: Path = typer.Argument(Path("runs"), help="The directory holding run directories."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a table."),
) -> None:
    """List the runs under ROOT and each start's status; record starts killed outright as crashed."""
    from gyre.runtime.run_status import is_live, run_dirs, settle

    if not root.is_dir():
        _fail(FileNotFoundError(f"{root}: no such directory (runs land under runs/ by default)"))
    found = []
    for run_dir in run_dirs(root):
        live = is_live(run_dir)
        found.append({"run_dir": str(run_dir), "live": live, "starts": [] if live else settle(run_dir)})
    prefect = None
    if os.environ.get("PREFECT_API_URL"):
        from gyre.flows.states import mark_starts

        changed = [c for row in found for c in mark_starts(Path(row["run_dir"]), row["starts"])]
        prefect = [{"run_dir": d, "flow_run_id": f, "state": s} for d, f, s in changed]
    if as_json:
        rows = [{**row, "starts": [asdict(s) for s in row["starts"]]} for row in found]
        print(json.dumps({"runs": rows, "prefect": prefect}, indent=2, default=str))
        return
    table = Table(title=f"runs under {root}")
    for column in ("run directory", "start", "status", "why", "Prefect flow run"):
        table.add_column(column)
    for row in found:
        if row["live"]:
            table.add_row(escape(row["run_dir"]), "", "live", "a process holds its file", "")
        for number, start in enumerate(row["starts"]):
            table.add_row(escape(row["run_dir"]) if number == 0 else "", str(start.started_at or ""), start.status,
                          escape(start.reason or ""), start.flow_run_id or "")
    print_table(table, console)
    if prefect is None:
        console.print("Prefect not contacted (PREFECT_API_URL unset): gyre's own server is brought up to date "
                      "when the next `gyre run` starts it")
    for change in prefect or []:
        console.print(f"Prefect: flow run {change['flow_run_id']} of {escape(change['run_dir'])} set "
                      f"{change['state']}")


def resume(
    run_dir: Path = typer.Argument(..., help="The run directory of a run suspended through Prefect.",
                                   metavar="RUN_DIR"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a line."),
) -> None:
    """Resume a run suspended through Prefect, as its flow run's Resume button does.

    The flow run is scheduled again, its worker starts the flow, which continues RUN_DIR from its last
    checkpoint."""
    from prefect.exceptions import ObjectNotFound, PrefectException
    from prefect.flow_runs import resume_flow_run

    from gyre.runtime.run_status import is_live, settle

    if not (run_dir / "gyre.duckdb").is_file():
        _fail(FileNotFoundError(f"{run_dir}: no run here (no gyre.duckdb)"))
    if not os.environ.get("PREFECT_API_URL"):
        _fail(ValueError("PREFECT_API_URL is unset: a suspended run lives on the Prefect server its deployment "
                         "ran on; export PREFECT_API_URL=http://HOST:PORT/api"))
    if is_live(run_dir):
        _fail(ValueError(f"{run_dir} is live (a process holds its file): nothing to resume"))
    starts = settle(run_dir)
    last = starts[-1] if starts else None
    if last is None or last.status != "suspended" or not last.flow_run_id:
        _fail(ValueError(f"{run_dir}: its last start is {last.status if last else 'missing'}, not suspended: "
                         f"`gyre run --resume {run_dir}` continues a stopped or crashed run"))
    try:
        resume_flow_run(last.flow_run_id)
    except (ObjectNotFound, PrefectException, RuntimeError) as exc:  # not paused, timed out, refused
        _fail(ValueError(f"{run_dir}: Prefect would not resume flow run {last.flow_run_id}: "
                         f"{type(exc).__name__}: {exc}"))
    if as_json:
        print(json.dumps({"run_dir": str(run_dir), "flow_run_id": last.flow_run_id, "resumed": True}))
        return
    console.print(f"resumed flow run {last.flow_run_id}: a worker of its deployment continues {escape(str(run_dir))} "
                  "from its last checkpoint")
