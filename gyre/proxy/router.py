"""Engine routing: which rollout engine serves a request.

Requests are sticky by execution (an execution's growing prompt stays where its prefix
cache is) with a least-loaded choice for an execution's first request. Engines register
and deregister as cells change role; draining and mid-request failover are the proxy
issue's work and extend this class.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from gyre.engines.base import RolloutEngine


class NoEngineError(RuntimeError):
    """No rollout engine is registered."""


class EngineRouter:
    def __init__(self, engines: list[RolloutEngine] | None = None) -> None:
        self._lock = threading.Lock()
        self._engines: dict[str, RolloutEngine] = {}
        self._in_flight: dict[str, int] = {}
        self._sticky: dict[str, str] = {}
        for engine in engines or []:
            self.register(engine)

    def register(self, engine: RolloutEngine) -> None:
        with self._lock:
            self._engines[engine.engine_id] = engine
            self._in_flight.setdefault(engine.engine_id, 0)

    def deregister(self, engine_id: str) -> None:
        with self._lock:
            self._engines.pop(engine_id, None)
            self._sticky = {e: eng for e, eng in self._sticky.items() if eng != engine_id}

    def engines(self) -> list[RolloutEngine]:
        with self._lock:
            return list(self._engines.values())

    @contextmanager
    def lease(self, execution_id: str):
        """Pick an engine for one request of `execution_id` and count it in flight."""
        with self._lock:
            if not self._engines:
                raise NoEngineError("no rollout engine is registered")
            engine_id = self._sticky.get(execution_id)
            if engine_id not in self._engines:
                engine_id = min(self._engines, key=lambda e: (self._in_flight[e], e))
                self._sticky[execution_id] = engine_id
            self._in_flight[engine_id] += 1
            engine = self._engines[engine_id]
        try:
            yield engine
        finally:
            with self._lock:
                self._in_flight[engine_id] -= 1
