"""The `text` harness: a multi-turn agent whose actions are fenced code blocks in plain replies.

For instruct models that never learnt a tool-call format (`fenced_actions.py` says why and what
the format is). Each turn sends the conversation to the proxy with no tools (so the model's chat
template renders plain turns, and the proxy records the call and splices the sampled ids back
token-in/token-out like any other), reads the reply's actions, runs them in the sandbox in the
order written, and sends what they did back as the next user turn, in mini-swe-agent's
observation shape (`<returncode>`, `<output>`). The format is said after the task in the first user
turn, as mini-swe-agent's instance template does; no system prompt unless one is set (the model's
template then adds its own). A reply with code but no action gets a format error as its
observation, which counts as a turn. A reply without any code block ends the
execution (the agent says it is done), as do `max_turns` and the deadline.

Why builtin and not the real `mini-swe-agent` CLI: mini-swe-agent takes one bash block and no
file blocks, so a model must write files through heredocs, which a 135M model cannot; and the
CLI runs in the sandbox, so every turn would pay its start-up. This harness keeps
mini-swe-agent's loop and observation format and adds aider's whole-file blocks.
"""

from __future__ import annotations

import time
from typing import Any

from gyre.harnesses.base import ExecutionSlot, HarnessOutcome, ModelEndpoint
from gyre.harnesses.fenced_actions import Action, RunCommand, WriteFile, parse
from gyre.harnesses.model_client import ModelClient
from gyre.records import ExecutionStatus, Query
from gyre.sandboxes.base import Sandbox

AGENT_ID = "main"

FORMAT = ("Answer in fenced code blocks: to write a file, its name on one line, then its complete code in a code "
          "block; to run a shell command, a ```bash block. Reply without a code block when the task is done.")
"""The format, said after the task in the first user turn (where mini-swe-agent's instance template says it)."""
FORMAT_ONE_FILE = "Answer with the complete code of the file in one ```python block."
"""The format with a default file: a block that names no file writes it. Measured on SmolLM2-135M-Instruct
(training queries, docs/learning.md): a system prompt describing the format, with or without an example, got
fewer usable replies than the model's own system prompt and the format after the task."""
FORMAT_RUN_FIRST = ("To run a shell command, reply with one ```bash block; what it prints comes back to you. When "
                    "you know the answer, reply with the complete code of the file in one ```python block.")
"""The format with a default file for tasks whose answer a command prints (`harness.text_run_first`, the `probe`
family): the command first, the file after, each turn's result in mini-swe-agent's observation shape."""


def observation(results: list[tuple[Action, int, str]], max_chars: int) -> str:
    """The next user turn: each action's return code and output, mini-swe-agent's shape."""
    parts = []
    for action, code, output in results:
        what = f"wrote {action.path}" if isinstance(action, WriteFile) else f"ran: {action.command.strip()[:200]}"
        parts.append(f"{what}\n<returncode>{code}</returncode>\n<output>\n{output[:max_chars]}</output>")
    return "\n\n".join(parts)


class TextHarness:
    name = "text"

    def __init__(self, *, max_turns: int = 4, command_timeout_s: float = 20.0, max_output_chars: int = 2000,
                 default_file: str | None = None, system_prompt: str | None = None, run_first: bool = False) -> None:
        self.max_turns = max_turns
        self.command_timeout_s = command_timeout_s
        self.max_output_chars = max_output_chars
        self.default_file = default_file
        self.system_prompt = system_prompt
        self.run_first = run_first

    def first_turn(self, instruction: str) -> list[dict[str, Any]]:
        """The conversation's start: the system prompt when one is set (else the model template's own),
        then the task with the format after it."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        fmt = (FORMAT_RUN_FIRST if self.run_first else FORMAT_ONE_FILE) if self.default_file else FORMAT
        return [*system, {"role": "user", "content": f"{instruction}\n\n{fmt}"}]

    def run(self, query: Query, sandbox: Sandbox, endpoint: ModelEndpoint, deadline_s: float,
            slot: ExecutionSlot | None = None) -> HarnessOutcome:
        messages = self.first_turn(query.instruction)
        with ModelClient(endpoint) as client:
            for turn in range(self.max_turns):
                response = client.chat(messages, [], AGENT_ID, deadline_s)
                if response is None:
                    return HarnessOutcome(ExecutionStatus.harness_timeout, turn)
                message = response["choices"][0]["message"]
                reply = message.get("content") or ""
                messages.append({"role": "assistant", "content": reply})
                parsed = parse(reply, self.default_file)
                if parsed.format_error is not None:
                    messages.append({"role": "user", "content": parsed.format_error})
                    continue
                if not parsed.actions:
                    return HarnessOutcome(ExecutionStatus.completed, turn + 1)
                results = [self._act(sandbox, action, deadline_s) for action in parsed.actions]
                messages.append({"role": "user", "content": observation(results, self.max_output_chars)})
        return HarnessOutcome(ExecutionStatus.completed, self.max_turns)

    def _act(self, sandbox: Sandbox, action: Action, deadline_s: float) -> tuple[Action, int, str]:
        """Run one action; (the action, its return code, its output) for the observation."""
        if isinstance(action, RunCommand):
            timeout = max(0.1, min(self.command_timeout_s, deadline_s - time.monotonic()))
            res = sandbox.exec(action.command, timeout_s=timeout)
            note = "\n(timed out)" if res.timed_out else f"\n(stopped: {res.limit_hit})" if res.limit_hit else ""
            return action, res.exit_code, res.stdout + res.stderr + note
        try:
            sandbox.write_file(action.path, action.content)
        except (ValueError, OSError) as exc:
            return action, 1, f"error: {exc}"
        return action, 0, ""
