"""The harness interface: something that drives a model through the proxy to do a task.

A harness is a black box to gyre (Claude Code, mini-swe-agent, a script, or the builtin
reference agent): it gets the query's instruction, a sandbox to act in, and a model
endpoint (the proxy's base URL and this execution's key). Everything gyre learns from comes
through the proxy, not from the harness; the harness only reports how it ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gyre.records import ExecutionStatus, Query
from gyre.sandboxes.base import Sandbox


@dataclass(frozen=True)
class ModelEndpoint:
    base_url: str  # e.g. http://127.0.0.1:PORT/v1
    api_key: str  # this execution's key; it maps every call to the execution
    model: str


@dataclass
class HarnessOutcome:
    status: ExecutionStatus
    turns: int
    error: str | None = None


class Harness(Protocol):
    name: str

    def run(self, query: Query, sandbox: Sandbox, endpoint: ModelEndpoint, deadline_s: float) -> HarnessOutcome:
        """Drive the agent until it finishes or `deadline_s` (time.monotonic) passes."""
        ...
