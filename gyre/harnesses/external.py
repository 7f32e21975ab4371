"""Run a black-box harness (a CLI) inside the sandbox as one long command against the proxy.

Claude Code, mini-swe-agent and any script are driven the same way: gyre builds their
command line and environment (the adapter's job), and this module runs it once inside
the execution's sandbox, so every tool call the harness makes acts on the workspace
under the sandbox's walls. Its only way out is the proxy (`Sandbox.open_proxy`, the
bridge), with this execution's key. The instruction is passed in the environment
(`GYRE_INSTRUCTION`) and as a file `$GYRE_INSTRUCTION_FILE` in the scratch `/tmp`, never
interpolated into shell text unquoted.

Timeouts, as in the paper, are separate: the harness gets `deadline_s - now` (the harness
wall-clock timeout set by the caller); the overall execution timeout is the caller's.
Outcome: the command timed out -> `harness_timeout` (workspace kept, still scored);
exit 0 -> `completed`; any other exit -> `harness_error` with the tail of its output.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence

from gyre.harnesses.base import HarnessOutcome, ModelEndpoint
from gyre.records import ExecutionStatus, Query
from gyre.sandboxes.base import Sandbox

INSTRUCTION_FILE = "/tmp/gyre-instruction.md"
_TAIL_CHARS = 800


def endpoint_env(endpoint: ModelEndpoint) -> dict[str, str]:
    """The proxy's URL and this execution's key under the names common clients read."""
    root = endpoint.base_url.rstrip("/").removesuffix("/v1")
    return {
        "OPENAI_BASE_URL": endpoint.base_url,
        "OPENAI_API_BASE": endpoint.base_url,
        "OPENAI_API_KEY": endpoint.api_key,
        "ANTHROPIC_BASE_URL": root,
        "ANTHROPIC_API_KEY": endpoint.api_key,
        "GYRE_MODEL": endpoint.model,
    }


def shell_line(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """`env K=V ... argv...`, every piece quoted."""
    assignments = [f"{k}={v}" for k, v in env.items()]
    return " ".join(shlex.quote(a) for a in ["env", *assignments, *argv])


def run_external(
    query: Query,
    sandbox: Sandbox,
    endpoint: ModelEndpoint,
    deadline_s: float,
    argv: Sequence[str],
    env: Mapping[str, str],
) -> HarnessOutcome:
    remaining = deadline_s - time.monotonic()
    if remaining <= 0:
        return HarnessOutcome(ExecutionStatus.harness_timeout, 0)
    open_proxy = getattr(sandbox, "open_proxy", None)
    prefix = open_proxy(endpoint.base_url) if open_proxy is not None else ""
    full_env = {**endpoint_env(endpoint), "GYRE_INSTRUCTION": query.instruction,
                "GYRE_INSTRUCTION_FILE": INSTRUCTION_FILE, **env}
    write_instruction = f"printf %s {shlex.quote(query.instruction)} > {INSTRUCTION_FILE}; "
    result = sandbox.exec(prefix + write_instruction + shell_line(argv, full_env), timeout_s=remaining)
    if result.timed_out:
        return HarnessOutcome(ExecutionStatus.harness_timeout, 1)
    if result.exit_code != 0:
        tail = (result.stderr.strip() or result.stdout.strip() or "(no output)")[-_TAIL_CHARS:]
        reason = f"; {result.limit_hit}" if result.limit_hit else ""
        return HarnessOutcome(ExecutionStatus.harness_error, 1, f"exit {result.exit_code}{reason}: {tail}")
    return HarnessOutcome(ExecutionStatus.completed, 1)
