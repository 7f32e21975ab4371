"""The `mini-swe-agent` harness: SWE-agent's minimal bash-only agent, against the proxy.

`mini -t <instruction> --model openai/<model> -y --exit-immediately` runs once inside
the sandbox; mini-swe-agent calls the model through litellm as an OpenAI-compatible
endpoint (OPENAI_API_BASE / OPENAI_BASE_URL = the proxy, OPENAI_API_KEY = this
execution's key), and runs each bash action in the workspace. Kept offline: litellm's
cost map is read locally (LITELLM_LOCAL_MODEL_COST_MAP), cost tracking never fails a run,
and its global config lives in the scratch `/tmp`, not the scored workspace.
"""

from __future__ import annotations

from gyre.harnesses.base import ExecutionSlot, HarnessOutcome, ModelEndpoint
from gyre.harnesses.external import INSTRUCTION_FILE, run_external
from gyre.records import Query
from gyre.sandboxes.base import Sandbox

OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/mswea",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "MSWEA_CONFIGURED": "true",
}


class MiniSweAgentHarness:
    name = "mini-swe-agent"

    def __init__(self, mini: str = "mini", extra_args: list[str] | None = None) -> None:
        self.mini = mini
        self.extra_args = list(extra_args or [])

    def argv(self, endpoint: ModelEndpoint) -> list[str]:
        return ["sh", "-c", f'exec "$0" -t "$(cat {INSTRUCTION_FILE})" "$@"', self.mini,
                "--model", f"openai/{endpoint.model}", "-y", "--exit-immediately", *self.extra_args]

    def env(self) -> dict[str, str]:
        return dict(OFFLINE_ENV)

    def run(self, query: Query, sandbox: Sandbox, endpoint: ModelEndpoint, deadline_s: float,
            slot: ExecutionSlot | None = None) -> HarnessOutcome:
        return run_external(query, sandbox, endpoint, deadline_s, self.argv(endpoint), self.env())
