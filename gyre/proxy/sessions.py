"""Per-execution proxy state: the API key, the recorded calls, the splice segments.

The run mints one key per execution; the key is the only thing that maps a request to an
execution, so one execution's key can never write into another's record. Thread-safe:
the proxy serves many executions concurrently.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field

from gyre.proxy.prompt import Segment
from gyre.records import Call


@dataclass
class ExecutionSession:
    execution_id: str
    calls: list[Call] = field(default_factory=list)
    segments: dict[str, Segment] = field(default_factory=dict)
    fallback_turns: int = 0


class SessionRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, ExecutionSession] = {}
        self._key_of: dict[str, str] = {}

    def mint(self, execution_id: str) -> str:
        with self._lock:
            if execution_id in self._key_of:
                raise ValueError(f"execution {execution_id} already has a key")
            key = f"gyre-{secrets.token_urlsafe(24)}"
            self._by_key[key] = ExecutionSession(execution_id)
            self._key_of[execution_id] = key
            return key

    def session(self, key: str) -> ExecutionSession | None:
        with self._lock:
            return self._by_key.get(key)

    def record(self, session: ExecutionSession, call: Call, canonical: str, segment: Segment, fallbacks: int) -> None:
        with self._lock:
            session.calls.append(call)
            session.segments[canonical] = segment
            session.fallback_turns += fallbacks

    def close(self, execution_id: str) -> ExecutionSession:
        """Revoke the key and hand over everything recorded for the execution."""
        with self._lock:
            key = self._key_of.pop(execution_id)
            return self._by_key.pop(key)
