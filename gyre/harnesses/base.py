"""The harness interface: something that drives a model through the proxy to do a task.

A harness is a black box to gyre (Claude Code, mini-swe-agent, a script, or the builtin
reference agent): it gets the query's instruction, a sandbox to act in, a model endpoint
(the proxy's base URL and this execution's key) and the execution's slot in the run (which
group, which sample; most harnesses ignore it, the `sleepy` one keys its waits on it).
Everything gyre learns from comes through the proxy, not from the harness; the harness only
reports how it ended.
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


@dataclass(frozen=True)
class ExecutionSlot:
    """Where an execution sits in its run: what a harness may key reproducible behaviour on."""

    execution_id: str
    purpose: str
    """`train` or `eval`."""
    run_seed: int
    group_id: int | None
    """The scheduler's number for the execution's group (step x queries_per_step + the query's place
    in that step's sample: `DispatchExecution.group_id`); None for evaluation executions."""
    index: int
    """The execution's place in its group, 0 .. group_size - 1."""
    group_size: int


@dataclass
class HarnessOutcome:
    status: ExecutionStatus
    turns: int
    error: str | None = None


class Harness(Protocol):
    name: str

    def run(
        self, query: Query, sandbox: Sandbox, endpoint: ModelEndpoint, deadline_s: float,
        slot: ExecutionSlot | None = None,
    ) -> HarnessOutcome:
        """Drive the agent until it finishes or `deadline_s` (time.monotonic) passes."""
        ...
