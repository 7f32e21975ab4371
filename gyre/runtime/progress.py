"""Run progress events for whoever is watching (the CLI's rich display, tests).

The coordinator announces what happens (a step started, an execution finished, a step
ended); listeners subscribe. A listener that raises is logged and dropped for that event:
a broken display must never stop training. DuckDB is not a listener; the coordinator
writes it directly, and its failures do stop the run.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProgressEvent:
    kind: str
    """run_started | step_started | execution_finished | execution_scored | trajectories_processed | step_finished |
    eval_started | eval_finished | cells | run_finished; the warm start's: warmstart_started | warmstart (each of
    its steps) | warmstart_finished | warmstart_cached."""
    step: int | None = None
    data: dict[str, Any] = field(default_factory=dict)


Listener = Callable[[ProgressEvent], None]

_lock = threading.Lock()
_listeners: list[Listener] = []


def subscribe(listener: Listener) -> Callable[[], None]:
    """Add a listener; returns a function that removes it."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def emit(event: ProgressEvent) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(event)
        except Exception:  # deliberate: a display must not stop a run
            log.exception("progress listener failed on %s", event.kind)
