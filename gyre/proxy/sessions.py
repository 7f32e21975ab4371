"""Per-execution proxy state: the API key, the recorded calls, the TITO splice memory.

The run mints one key per execution; the key is the only thing that maps a request to an
execution, so one execution's key can never write into another's record, and one
execution's recorded outputs are never spliced into another's prompt. Thread-safe: the
proxy serves many executions concurrently while the run mints and closes keys.

Every call that becomes part of an execution's record is also handed to the registry's
`sink` at that moment (the run's or the standalone proxy's `CallLog`, which puts it on
disk within a second); a call that ends after its execution was closed goes nowhere.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gyre.proxy.message_cache import MessageCache
from gyre.proxy.prompt import TitoCache
from gyre.records import Call


@dataclass
class ExecutionSession:
    execution_id: str
    calls: list[Call] = field(default_factory=list)
    tito: TitoCache = field(default_factory=TitoCache)
    fallback_turns: int = 0
    """Assistant turns the harness sent back changed, so template tokens stood in for them."""
    closed: bool = False
    messages: MessageCache = field(default_factory=MessageCache)
    """The validated messages of its recent conversations (`message_cache.py`)."""
    builds: Any = None
    """Its builds in a worker process, when the proxy has them (`build_processes.ExecutionBuilds`)."""

    @property
    def segments(self):
        """Canonical turn text -> recorded segment (what splicing matches against)."""
        return self.tito.segments


class SessionRegistry:
    def __init__(self, sink: Callable[[Call], None] | None = None) -> None:
        """`sink`: receives each recorded call as it is recorded (None: kept in memory only)."""
        self._sink = sink
        self._lock = threading.Lock()
        self._by_key: dict[str, ExecutionSession] = {}
        self._key_of: dict[str, str] = {}
        self.on_close: Callable[[str], None] | None = None
        """Called with an execution's id once it is closed (the proxy's build workers drop its state)."""

    def mint(self, execution_id: str) -> str:
        with self._lock:
            if execution_id in self._key_of:
                raise ValueError(f"execution {execution_id} already has a key")
            key = f"gyre-{secrets.token_urlsafe(24)}"
            self._by_key[key] = ExecutionSession(execution_id)
            self._key_of[execution_id] = key
            return key

    def add(self, execution_id: str, key: str) -> None:
        """Register a key chosen elsewhere (a standalone proxy's static keys)."""
        with self._lock:
            if execution_id in self._key_of or key in self._by_key:
                raise ValueError(f"execution {execution_id} or its key is already registered")
            self._by_key[key] = ExecutionSession(execution_id)
            self._key_of[execution_id] = key

    def session(self, key: str) -> ExecutionSession | None:
        return self._by_key.get(key)  # a dict read is atomic; mint/close hold the lock

    def record(self, session: ExecutionSession, call: Call, fallback_turns: int) -> None:
        with self._lock:
            if session.closed:
                return  # the execution ended while this call ran: it is not part of its record
            if self._sink is not None:
                self._sink(call)
            session.calls.append(call)
            session.fallback_turns += fallback_turns

    def close(self, execution_id: str) -> ExecutionSession:
        """Revoke the key and hand over everything recorded for the execution."""
        with self._lock:
            key = self._key_of.pop(execution_id)
            session = self._by_key.pop(key)
            session.closed = True
        if self.on_close is not None:
            self.on_close(execution_id)
        return session
