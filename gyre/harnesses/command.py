"""The `command` harness: any command line, run inside the sandbox with the proxy in its environment.

For bringing your own agent: `argv` runs once in the workspace with OPENAI_BASE_URL /
OPENAI_API_KEY / ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY / GYRE_MODEL pointing at the proxy
with this execution's key, and the instruction in GYRE_INSTRUCTION and the file
$GYRE_INSTRUCTION_FILE (see `gyre.harnesses.external`). Nothing else of the host
environment reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gyre.harnesses.base import ExecutionSlot, HarnessOutcome, ModelEndpoint
from gyre.harnesses.external import run_external
from gyre.records import Query
from gyre.sandboxes.base import Sandbox


class CommandHarness:
    name = "command"

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        if not argv:
            raise ValueError("command harness needs a non-empty argv")
        self.argv = list(argv)
        self.env = dict(env or {})

    def run(self, query: Query, sandbox: Sandbox, endpoint: ModelEndpoint, deadline_s: float,
            slot: ExecutionSlot | None = None) -> HarnessOutcome:
        return run_external(query, sandbox, endpoint, deadline_s, self.argv, self.env)
