"""The conversations a warm start trains on: a harness's own turns for a training query, solved.

A warm start teaches the format the run's harness speaks, so its demonstrations must be exactly what that
harness sends and reads, rendered as the proxy renders them:
- `builtin`: the system prompt and tools, the instruction, a `write_file` call with the reference solution,
  the tool result, a `finish` call (`demonstration`);
- `text` (`text_demonstration`): the harness's own first turn (the task, then its format sentence), and for a
  harness that runs commands first (`run_first`, the `probe` family) a ```bash block running each of the
  query's starting scripts with the observation the harness would send back, the script's real output
  (`script_outputs`: run here, in a copy of the starting files); then the reference in one ```python block,
  its observation, and a reply without code (the agent says it is done). The value a probe prints is read
  from the observation, as the agent must, never written into the instruction.

`render` turns a conversation into token ids and, per token, whether the model learns it: the assistant turns
up to their end-of-turn marker, the rest context (the split the proxy makes on live calls).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gyre.harnesses.builtin import SYSTEM_PROMPT, TOOLS
from gyre.harnesses.fenced_actions import RunCommand, WriteFile
from gyre.harnesses.text_agent import TextHarness, observation
from gyre.proxy.prompt import PromptBuilder
from gyre.records import Query

START_DIR = "start"
"""A generated query's starting files (`gyre.benchmarks.tiny`: `<root>/start/`)."""
SCRIPT_TIMEOUT_S = 20.0
"""Longest a starting script may run to give its output (the text harness's command timeout)."""
DONE_REPLY = "Done."
"""The demonstrated last reply: no code block, so the text harness ends the execution."""


def demonstration(query: Query, solution_file: str, solution: str) -> list[dict[str, Any]]:
    """The builtin harness's conversation for `query`, solved in two tool calls."""
    write = {"name": "write_file", "arguments": {"path": solution_file, "content": solution}}
    finish = {"name": "finish", "arguments": {"summary": "done"}}
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": query.instruction},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": write}]},
        {"role": "tool", "content": f"wrote {len(solution)} characters to {solution_file}"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": finish}]},
    ]


def script_outputs(query: Query, timeout_s: float = SCRIPT_TIMEOUT_S) -> list[tuple[str, int, str]]:
    """(command, return code, output) of `python <script>` for each starting script of `query`, in name order,
    each run in a fresh copy of the starting files (what the agent's workspace starts as)."""
    start = Path(query.root) / START_DIR
    scripts = sorted(p.name for p in start.glob("*.py")) if start.is_dir() else []
    out = []
    for script in scripts:
        with tempfile.TemporaryDirectory(prefix="gyre-demo-") as tmp:
            work = Path(tmp) / "w"
            shutil.copytree(start, work)
            done = subprocess.run([sys.executable, script], cwd=work, capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        out.append((f"python {script}", done.returncode, done.stdout + done.stderr))
    return out


def text_demonstration(query: Query, harness: TextHarness, solution_file: str, solution: str) -> list[dict[str, Any]]:
    """The `text` harness's conversation for `query`, solved: the starting scripts run first when the harness
    says to (`run_first`), then the file, then done."""
    messages = harness.first_turn(query.instruction)
    if harness.run_first:
        for command, code, output in script_outputs(query):
            messages.append({"role": "assistant", "content": f"```bash\n{command}\n```"})
            messages.append({"role": "user", "content": observation([(RunCommand(command), code, output)],
                                                                   harness.max_output_chars)})
    body = solution if solution.endswith("\n") else solution + "\n"
    named = "" if solution_file == harness.default_file else f"{solution_file}\n"
    messages.append({"role": "assistant", "content": f"{named}```python\n{body}```"})
    messages.append({"role": "user", "content": observation([(WriteFile(solution_file, solution), 0, "")],
                                                           harness.max_output_chars)})
    messages.append({"role": "assistant", "content": DONE_REPLY})
    return messages


def render(builder: PromptBuilder, messages: list[dict[str, Any]],
           tools: list[dict[str, Any]] | None = TOOLS) -> tuple[list[int], list[bool]]:
    """Token ids of the conversation and, per token, whether the model is to learn it.

    The same split the proxy makes: template text is context; each assistant turn up to
    and including its end-of-turn marker is a target. `tools`: what the harness sends (None: the `text`
    harness, which sends none).
    """
    full = builder.render(messages, tools, generation_prompt=False)
    ids: list[int] = []
    trainable: list[bool] = []
    cursor = 0

    def add(text: str, target: bool) -> None:
        piece = builder.encode(text)
        ids.extend(piece)
        trainable.extend([target] * len(piece))

    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(builder.render(messages[:i], tools, generation_prompt=True))
        stop = len(builder.render(messages[: i + 1], tools, generation_prompt=False))
        segment = full[start:stop]
        end = segment.rfind(builder.end_of_turn) + len(builder.end_of_turn)
        add(full[cursor:start], False)
        add(segment[:end], True)
        add(segment[end:], False)
        cursor = stop
    add(full[cursor:], False)
    return ids, trainable
