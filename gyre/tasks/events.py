"""What gyre tells Prefect from inside a run: events, with one resource per run (`gyre.run.<run_id>`), and log lines.

Automations match on the events (docs/prefect.md): the event names are `gyre.step.*`,
`gyre.evaluation.*` and `gyre.cells.role-switch`; each is related to the flow run that
emitted it, so an automation can pause or cancel exactly that run. `prefect_logger()` is the
logger whose lines show in the current flow or task run's Logs. Both the tasks and the flows'
UI wiring (`gyre.flows.ui`) use this module, so it sits on the tasks' floor.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect.events import emit_event
from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger
from prefect.runtime import flow_run


def run_resource(run_id: str, name: str) -> dict[str, str]:
    return {"prefect.resource.id": f"gyre.run.{run_id}", "prefect.resource.name": name}


def related_flow_run() -> list[dict[str, str]]:
    """The current flow run as an event's related resource (none outside a flow run)."""
    run_id = flow_run.id
    return [{"prefect.resource.id": f"prefect.flow-run.{run_id}", "prefect.resource.role": "flow-run"}] if run_id else []


def emit_run_event(event: str, run_id: str, name: str, payload: dict[str, Any],
                   related: list[dict[str, str]] | None = None) -> None:
    """`event` on the run's resource, related to the current flow run (and to `related`, other resources)."""
    emit_event(event=event, resource=run_resource(run_id, name), related=[*related_flow_run(), *(related or [])],
               payload=payload)


log = logging.getLogger(__name__)


def prefect_logger() -> logging.Logger | logging.LoggerAdapter:
    """The run logger (shown in the UI) when inside a flow or task run, else this module's."""
    try:
        return get_run_logger()
    except MissingContextError:  # outside a flow or task run (tests, a listener thread): the module's logger
        return log
