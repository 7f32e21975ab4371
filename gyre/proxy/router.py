"""Engine routing: which rollout engine serves the next piece of a request.

Rollout engines come and go as cells change role, and no live execution may notice. The
router keeps, per registered engine, the attempts in flight on it:

- `acquire` picks an engine for one attempt: sticky by execution (its growing prompt stays
  where its prefix cache is), else the least-loaded active engine. With no engine active
  it waits (bounded by `max_wait_s`) instead of failing, since a role switch leaves a short
  gap with no rollout capacity.
- `drain(engine_id)` stops routing there and sets the stop event of every attempt in
  flight on it. The engine returns those attempts' tokens so far; the proxy's generation
  loop (`generation.py`) resubmits prompt + tokens so far to another engine, so the
  harness sees one uninterrupted response. `drain` returns once nothing is in flight
  there, so the caller can then swap weights (and `resume`) or `deregister`.

Thread-safe: the proxy's event loop acquires and releases; cells drain from other threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from gyre.engines.base import RolloutEngine

DEFAULT_MAX_WAIT_S = 120.0
"""How long a request waits for an engine to become available before failing."""
ACQUIRE_POLL_S = 0.01
"""Polling interval while waiting for an engine (doubles up to ACQUIRE_POLL_MAX_S)."""
ACQUIRE_POLL_MAX_S = 0.2
STICKY_CAPACITY = 65536
"""Executions remembered for stickiness (least recently used forgotten first)."""


class NoEngineError(RuntimeError):
    """No rollout engine became available within the router's wait bound."""


@dataclass(eq=False)
class Lease:
    """One attempt in flight on one engine. `stop` is set when that engine drains."""

    engine: RolloutEngine
    engine_id: str
    stop: threading.Event = field(default_factory=threading.Event)
    _state: "_EngineState | None" = field(default=None, repr=False)


@dataclass(eq=False)
class _EngineState:
    engine: RolloutEngine
    draining: bool = False
    in_flight: set[Lease] = field(default_factory=set)


class EngineRouter:
    def __init__(self, engines: list[RolloutEngine] | None = None, *, max_wait_s: float = DEFAULT_MAX_WAIT_S) -> None:
        self.max_wait_s = max_wait_s
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._engines: dict[str, _EngineState] = {}
        self._sticky: OrderedDict[str, str] = OrderedDict()
        for engine in engines or []:
            self.register(engine)

    # -- membership (cells call these) --------------------------------------------------

    def register(self, engine: RolloutEngine) -> None:
        """Add an engine, or re-activate one that was drained."""
        with self._lock:
            state = self._engines.get(engine.engine_id)
            if state is None:
                self._engines[engine.engine_id] = _EngineState(engine)
            else:
                state.engine, state.draining = engine, False

    def resume(self, engine_id: str) -> None:
        """Route to a drained engine again (after its weight swap)."""
        with self._lock:
            self._engines[engine_id].draining = False

    def drain(self, engine_id: str, timeout_s: float | None = None) -> bool:
        """Stop routing to `engine_id`, hand its in-flight attempts elsewhere, and wait
        until none is left there. Returns False if some remain after `timeout_s`."""
        with self._lock:
            state = self._engines[engine_id]
            state.draining = True
            for lease in state.in_flight:
                lease.stop.set()
            return self._idle.wait_for(lambda: not state.in_flight, timeout=timeout_s)

    def deregister(self, engine_id: str) -> None:
        """Remove an engine at once; attempts still on it are told to stop (and move)."""
        with self._lock:
            state = self._engines.pop(engine_id, None)
            if state is not None:
                for lease in state.in_flight:
                    lease.stop.set()

    def engines(self) -> list[RolloutEngine]:
        """Every registered engine, draining ones included (weights go to all of them)."""
        with self._lock:
            return [s.engine for s in self._engines.values()]

    def busy(self) -> bool:
        """Whether any attempt is in flight on any engine."""
        with self._lock:
            return any(s.in_flight for s in self._engines.values())

    def load(self) -> dict[str, int]:
        """Attempts in flight per registered engine."""
        with self._lock:
            return {eid: len(s.in_flight) for eid, s in self._engines.items()}

    # -- attempts (the proxy calls these) -----------------------------------------------

    def try_acquire(self, execution_id: str, avoid: frozenset[str] = frozenset()) -> Lease | None:
        """An attempt on the execution's sticky engine, else the least-loaded active one.
        Engines in `avoid` (they just failed this request) are used only if nothing else is."""
        with self._lock:
            active = [eid for eid, s in self._engines.items() if not s.draining]
            if not active:
                return None
            preferred = [eid for eid in active if eid not in avoid] or active
            engine_id = self._sticky.get(execution_id)
            if engine_id not in preferred:
                engine_id = min(preferred, key=lambda e: (len(self._engines[e].in_flight), e))
            self._sticky[execution_id] = engine_id
            self._sticky.move_to_end(execution_id)
            if len(self._sticky) > STICKY_CAPACITY:
                self._sticky.popitem(last=False)
            state = self._engines[engine_id]
            lease = Lease(state.engine, engine_id, _state=state)
            state.in_flight.add(lease)
            return lease

    async def acquire(self, execution_id: str, avoid: frozenset[str] = frozenset()) -> Lease:
        """Like `try_acquire`, waiting up to `max_wait_s` for an engine to be available."""
        lease = self.try_acquire(execution_id, avoid)
        if lease is not None:
            return lease
        deadline = time.monotonic() + self.max_wait_s
        poll_s = ACQUIRE_POLL_S
        while lease is None:
            if time.monotonic() >= deadline:
                raise NoEngineError(f"no rollout engine became available within {self.max_wait_s:g} s")
            await asyncio.sleep(poll_s)
            poll_s = min(poll_s * 2, ACQUIRE_POLL_MAX_S)
            lease = self.try_acquire(execution_id, avoid)
        return lease

    def release(self, lease: Lease) -> None:
        with self._lock:
            lease._state.in_flight.discard(lease)
            self._idle.notify_all()
