"""The Prefect states of a run that ended outside Prefect's engine: stopped by a signal, killed with -9.

`gyre run` handles SIGINT/SIGTERM itself (`gyre.runtime.lifecycle.StopOnSignal`): it closes the run
in order and leaves with `os._exit`, so Prefect's engine never reports a final state, and a flow run
left alone reads "Running" for good, with its open task runs. A kill -9 reports nothing at all.
What users watch must say what happened, so:

- a stop ends the flow run Cancelled and every task run of it still scheduled, pending or running
  Cancelled with it (`end_flow_run`, from the run's stop closer, before the Prefect server goes);
- a suspend through Prefect (a deployment's run; Prefect ends the process at the next task boundary)
  leaves the flow run Suspended, as Prefect set it, and Cancels its open task runs (`close_task_runs`):
  resuming the flow run starts the flow again, which continues the same run directory;
- a start of a run that died without a word (DuckDB `runs.status` still `running` while nobody holds
  the run's file) is marked Crashed, with its open task runs, at the next contact: the resume of that
  run directory, `gyre runs`, or the start of gyre's own Prefect server (`reconcile`).

Each call is bounded (`API_TIMEOUT_S`); a Prefect server that cannot be reached is named on stderr,
never raised into a stopping or starting run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

API_TIMEOUT_S = 10.0
"""Bound on each Prefect API call made here (a stopping run has `lifecycle.STOP_GRACE_S` in all)."""
OPEN_TYPES = ("SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING")
"""Task-run state types that a flow run which ended leaves open."""
EVENTS_DRAIN_S = 5.0
"""How long a stopping run waits for its queued Prefect events (task runs' states) to leave."""
PREFECT_KIND = {"stopped": "Cancelled", "crashed": "Crashed", "failed": "Failed"}
"""The Prefect state a run start's DuckDB status ends its flow run in."""
SETTLE_ROUNDS = 10
SETTLE_WAIT_S = 0.5
SETTLE_QUIET_READS = 3
"""A live run's task-run states reach the server as events, recorded a moment later (seconds on a loaded box):
the open task runs are read again (`SETTLE_ROUNDS` times at most, `SETTLE_WAIT_S` apart) until
`SETTLE_QUIET_READS` reads in a row find none."""


def end_flow_run(flow_run_id: str | None, kind: str, message: str, live: bool = False) -> bool:
    """Set flow run `flow_run_id` and its open task runs to `kind` (Cancelled, Crashed, Failed, or Completed: a run
    judged again by a rerun of its failed evaluations), forced past
    Prefect's orchestration rules (the engine that would have reported is gone). `live`: called from the run's
    own process as it stops (its queued events are sent first, and late task runs are waited for). False when
    there is no flow run or the API cannot be reached (said on stderr)."""
    return _end(flow_run_id, kind, message, live, flow_too=True)


def close_task_runs(flow_run_id: str | None, kind: str, message: str) -> bool:
    """The open task runs of flow run `flow_run_id` set to `kind`, its own state left as Prefect made it (a
    suspended flow run stays Suspended: its executions in flight were abandoned, the resume reruns them)."""
    return _end(flow_run_id, kind, f"its flow run was {message}", live=True, flow_too=False)


def _end(flow_run_id: str | None, kind: str, message: str, live: bool, flow_too: bool) -> bool:
    if not flow_run_id:
        return False
    import time

    from prefect.events.worker import EventsWorker
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterState, TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_REQUEST_TIMEOUT, temporary_settings
    from prefect.states import Cancelled, Completed, Crashed, Failed

    make = {"Cancelled": Cancelled, "Crashed": Crashed, "Failed": Failed, "Completed": Completed}[kind]
    still_open = TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(
        any_=[StateType(t) for t in OPEN_TYPES])))
    task_message = f"its flow run ended: {message}" if flow_too else message
    try:
        if live:
            EventsWorker.drain_all(timeout=EVENTS_DRAIN_S)
        with temporary_settings({PREFECT_API_REQUEST_TIMEOUT: API_TIMEOUT_S}), get_client(sync_client=True) as client:
            if flow_too:
                client.set_flow_run_state(flow_run_id, make(message=message), force=True)
            quiet = 0
            for _ in range(SETTLE_ROUNDS if live else 1):
                open_tasks = client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])), task_run_filter=still_open)
                for task_run in open_tasks:
                    client.set_task_run_state(task_run.id, make(message=task_message), force=True)
                quiet = 0 if open_tasks else quiet + 1
                if quiet >= SETTLE_QUIET_READS:
                    break
                if live:
                    time.sleep(SETTLE_WAIT_S)
    except Exception as exc:  # deliberate: a stopping run must still stop; the API's absence is said, not raised
        what = f"flow run {flow_run_id}" if flow_too else f"the task runs of flow run {flow_run_id}"
        print(f"gyre: could not mark {what} {kind}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return False
    return True


def flow_run_state(flow_run_id: str) -> str | None:
    """The state type of a flow run (`RUNNING`, `CANCELLED`, ...), or None when the API cannot say."""
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(flow_run_id)
    except Exception:  # deliberate: unknown is an answer here (`reconcile` then leaves the run alone)
        return None
    return None if run.state is None else run.state.type.value


def reconcile(run_dirs: Iterable[Path]) -> list[tuple[str, str, str]]:
    """Bring Prefect up to what each run directory's DuckDB file says (`runtime.run_status.settle`, then
    `mark_starts`). Returns (run directory, flow run id, state set) for each flow run changed."""
    import duckdb

    from gyre.runtime.run_status import settle

    changed = []
    for run_dir in run_dirs:
        try:
            starts = settle(Path(run_dir))
        except duckdb.Error as exc:  # deliberate: one unreadable run file must not stop the others (or a run)
            print(f"gyre: {run_dir}: run file unreadable, left as it is: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
            continue
        changed += mark_starts(run_dir, starts)
    return changed


def mark_starts(run_dir: Path, starts) -> list[tuple[str, str, str]]:
    """A settled run's starts (`run_status.RunStart`) in Prefect: a start the file calls stopped, crashed or
    failed whose flow run still reads open is set so (a start found dead becomes Crashed)."""
    changed = []
    for start in starts:
        if not start.flow_run_id or start.status not in PREFECT_KIND:
            continue
        if flow_run_state(start.flow_run_id) not in OPEN_TYPES:
            continue
        if end_flow_run(start.flow_run_id, PREFECT_KIND[start.status], start.reason or start.status):
            changed.append((str(run_dir), start.flow_run_id, PREFECT_KIND[start.status]))
    return changed
