"""The `claude-code` harness: Anthropic's Claude Code CLI in print mode, against the proxy.

`claude -p <instruction> --output-format json` runs once inside the sandbox as the
sandbox's unprivileged user (it refuses to skip permission prompts as root), with
ANTHROPIC_BASE_URL = the proxy (its Anthropic Messages endpoint, `/v1/messages`) and
ANTHROPIC_API_KEY = this execution's key, and every kind of non-essential traffic
(telemetry, error reports, auto-update, feedback) disabled, so the proxy is the only
thing it talks to. Its configuration lives in the scratch `/tmp` (CLAUDE_CONFIG_DIR), not
the scored workspace. Measured facts about the CLI (node 20 needs `@2.1.197`, the
requests it sends) are in DEPENDENCIES.md.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gyre.harnesses.base import ExecutionSlot, HarnessOutcome, ModelEndpoint
from gyre.harnesses.external import INSTRUCTION_FILE, run_external
from gyre.records import Query
from gyre.sandboxes.base import Sandbox

QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CONFIG_DIR": "/tmp/claude-config",
    "IS_SANDBOX": "1",
}


def find_claude() -> str | None:
    return shutil.which("claude")


def claude_install_dirs(claude: str) -> list[Path]:
    """Host directories the CLI needs to run (its package, node), for read-only mounts."""
    real = Path(os.path.realpath(claude))
    dirs = [real.parent]
    for parent in real.parents:
        if parent.name == "node_modules":
            dirs.append(parent)
            break
    node = shutil.which("node")
    if node:
        dirs.append(Path(os.path.realpath(node)).parent)
    return dirs


class ClaudeCodeHarness:
    name = "claude-code"

    def __init__(self, claude: str = "claude", max_turns: int | None = None, extra_args: list[str] | None = None) -> None:
        self.claude = claude
        self.max_turns = max_turns
        self.extra_args = list(extra_args or [])

    def argv(self, endpoint: ModelEndpoint) -> list[str]:
        argv = ["sh", "-c", f'exec "$0" -p "$(cat {INSTRUCTION_FILE})" "$@"', self.claude,
                "--output-format", "json", "--model", endpoint.model, "--dangerously-skip-permissions"]
        if self.max_turns is not None:
            argv += ["--max-turns", str(self.max_turns)]
        return argv + self.extra_args

    def env(self) -> dict[str, str]:
        return dict(QUIET_ENV)

    def run(self, query: Query, sandbox: Sandbox, endpoint: ModelEndpoint, deadline_s: float,
            slot: ExecutionSlot | None = None) -> HarnessOutcome:
        return run_external(query, sandbox, endpoint, deadline_s, self.argv(endpoint), self.env())
