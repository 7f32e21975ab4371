"""Prefect events gyre emits, with one resource per run (`gyre.run.<run_id>`).

Automations match on these (docs/prefect.md): the event names are `gyre.step.*`,
`gyre.evaluation.*` and `gyre.cells.role-switch`; each is related to the flow run that
emitted it, so an automation can pause or cancel exactly that run.
"""

from __future__ import annotations

from typing import Any

from prefect.events import emit_event
from prefect.runtime import flow_run


def run_resource(run_id: str, name: str) -> dict[str, str]:
    return {"prefect.resource.id": f"gyre.run.{run_id}", "prefect.resource.name": name}


def related_flow_run() -> list[dict[str, str]]:
    """The current flow run as an event's related resource (none outside a flow run)."""
    run_id = flow_run.id
    return [{"prefect.resource.id": f"prefect.flow-run.{run_id}", "prefect.resource.role": "flow-run"}] if run_id else []


def emit_run_event(event: str, run_id: str, name: str, payload: dict[str, Any]) -> None:
    emit_event(event=event, resource=run_resource(run_id, name), related=related_flow_run(), payload=payload)
