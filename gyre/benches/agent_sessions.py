"""Agent-shaped sessions for the proxy benchmark, as a coding harness sends them, from a seed.

A real agent call is not one short question: it is a system prompt and tool definitions,
the task, and every earlier turn of the loop, where each assistant turn holds tool calls and
the next request appends their results (a file's contents, a test run's output, grep hits).
So each call's prompt is the previous one plus hundreds to thousands of tokens, and a
session's k-th call carries everything before it.

`agent_sessions(n, turns, seed)` builds `n` such sessions, each with `turns` calls, fully
deterministic from the seed: the builtin agent's system prompt and tools
(`gyre/harnesses/builtin.py`) plus Claude-Code-like `read_file`, `edit_file`, `grep` and
`glob`; steps that list files, read them (sometimes two in parallel), grep, run the tests,
edit and run the tests again, with results of realistic sizes (`result_chars`). Every session
renders its k-th call (1-based) as an OpenAI chat-completions body (`openai_body`: assistant
`tool_calls` with JSON-string arguments, `role: "tool"` results) and as an Anthropic messages
body (`anthropic_body`: `tool_use` blocks, `tool_result` blocks in the next user turn, the
system prompt as blocks, as Claude Code sends it). Both shapes carry the same conversation.

The assistant turns are scripted here, not taken from a model: a replay appends them whatever
the engine answered (see `gyre/benches/proxy_sessions.py` for what that means for the proxy).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

from gyre.harnesses.builtin import SYSTEM_PROMPT
from gyre.harnesses.builtin_tools import TOOLS

APIS = ("openai", "anthropic")
DEFAULT_RESULT_CHARS = (800, 4000)
"""Characters of one step's tool results, drawn log-uniformly (~1.6 characters per token
with the bundled tokenizer: ~500 to ~2,500 tokens a step)."""


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


_STR = {"type": "string"}
EXTRA_TOOLS: list[dict[str, Any]] = [
    _tool("read_file", "Read a file from the repository. Returns its contents with line numbers. Read a file "
          "before editing it; prefer reading whole files over guessing their contents.",
          {"path": _STR, "offset": {"type": "integer"}, "limit": {"type": "integer"}}, ["path"]),
    _tool("edit_file", "Replace one exact occurrence of old_string with new_string in a file. The edit fails "
          "when old_string is not found or is not unique; include enough context to make it unique.",
          {"path": _STR, "old_string": _STR, "new_string": _STR}, ["path", "old_string", "new_string"]),
    _tool("grep", "Search file contents with a regular expression; returns matching lines as path:line: text.",
          {"pattern": _STR, "path": _STR, "glob": _STR}, ["pattern"]),
    _tool("glob", "List files whose paths match a glob pattern, sorted by modification time.",
          {"pattern": _STR}, ["pattern"]),
]
AGENT_TOOLS: list[dict[str, Any]] = TOOLS + EXTRA_TOOLS
"""OpenAI function shape; `anthropic_body` converts them."""

AGENT_SYSTEM_PROMPT = SYSTEM_PROMPT + (
    "\n\nWork step by step. Before changing code, find the relevant files with glob and grep and "
    "read them with read_file. Make small, focused edits with edit_file; use write_file only for new "
    "files. After every change run the test suite with run_shell and read the failures carefully. "
    "Never guess a file's contents. Keep the repository's style: type hints, docstrings, no unused "
    "imports. When several independent reads are needed, call the tools in parallel. Report what "
    "you changed and why when you call finish."
)

_WORDS = ("parse", "load", "merge", "split", "token", "cache", "index", "range", "value", "record", "batch",
          "window", "buffer", "config", "report", "score", "query", "field", "table", "chunk", "stream",
          "limit", "offset", "weight", "group", "state", "event", "queue", "entry", "count")
_THOUGHTS = ("Let me look at the repository layout first.", "I'll read the module the tests import.",
             "The failure points at the parser; let me check where it is used.",
             "Let me run the tests to see what fails.", "I'll fix the off-by-one in the loop.",
             "Now the tests again.", "Let me read the test file to see the expected behaviour.",
             "Two modules are involved; I'll read both.")


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Step:
    """One loop iteration: the assistant's text and tool calls, then one result per call."""

    text: str
    calls: tuple[ToolCall, ...]
    results: tuple[str, ...]


@dataclass(frozen=True)
class AgentSession:
    """One execution's calls: call k (1-based) sends the task and steps[: k - 1]."""

    session_id: str
    api: str  # "openai" | "anthropic": the shape its harness speaks
    system: str
    tools: list[dict[str, Any]]
    task: str
    steps: tuple[Step, ...]

    @property
    def turns(self) -> int:
        return len(self.steps) + 1

    def openai_messages(self, k: int) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system},
                                          {"role": "user", "content": self.task}]
        for step in self._steps_before(k):
            messages.append({"role": "assistant", "content": step.text, "tool_calls": [
                {"id": c.call_id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in step.calls]})
            messages += [{"role": "tool", "tool_call_id": c.call_id, "content": r}
                         for c, r in zip(step.calls, step.results)]
        return messages

    def openai_body(self, k: int, max_tokens: int, temperature: float = 0.0) -> dict[str, Any]:
        return {"model": "gyre", "messages": self.openai_messages(k), "tools": self.tools,
                "max_tokens": max_tokens, "temperature": temperature}

    def anthropic_body(self, k: int, max_tokens: int, temperature: float = 0.0) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": self.task}]}]
        for step in self._steps_before(k):
            messages.append({"role": "assistant", "content": [{"type": "text", "text": step.text}] + [
                {"type": "tool_use", "id": c.call_id, "name": c.name, "input": c.arguments} for c in step.calls]})
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": c.call_id, "content": r}
                for c, r in zip(step.calls, step.results)]})
        tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                  "input_schema": t["function"]["parameters"]} for t in self.tools]
        return {"model": "gyre", "system": [{"type": "text", "text": self.system}], "tools": tools,
                "messages": messages, "max_tokens": max_tokens, "temperature": temperature}

    def body(self, k: int, max_tokens: int, temperature: float = 0.0) -> dict[str, Any]:
        """Call k's request body in this session's API shape."""
        build = self.openai_body if self.api == "openai" else self.anthropic_body
        return build(k, max_tokens, temperature)

    def _steps_before(self, k: int) -> tuple[Step, ...]:
        if not 1 <= k <= self.turns:
            raise ValueError(f"call {k} of a {self.turns}-call session")
        return self.steps[: k - 1]


def agent_sessions(
    n: int, turns: int, seed: int = 0, *, api: str = "mixed",
    result_chars: tuple[int, int] = DEFAULT_RESULT_CHARS,
) -> list[AgentSession]:
    """`n` sessions of `turns` calls each; `api`: "openai", "anthropic" or "mixed" (alternating)."""
    if api not in (*APIS, "mixed"):
        raise ValueError(f"api must be one of {APIS + ('mixed',)}, got {api!r}")
    if turns < 1:
        raise ValueError(f"a session needs at least one call, got turns={turns}")
    return [_session(i, turns, random.Random(f"{seed}-{i}"), APIS[i % 2] if api == "mixed" else api, result_chars)
            for i in range(n)]


def _session(index: int, turns: int, rng: random.Random, api: str, result_chars: tuple[int, int]) -> AgentSession:
    package = f"{rng.choice(_WORDS)}{rng.choice(_WORDS)}"
    files = [f"src/{package}/{w}.py" for w in rng.sample(_WORDS, 5)]
    files += [f"tests/test_{w}.py" for w in rng.sample(_WORDS, 3)]
    target = files[0]
    task = (f"The package `{package}` fails its tests: `{_func(rng)}` in {target} returns wrong results for "
            f"empty input and for the last {rng.choice(_WORDS)} of a {rng.choice(_WORDS)}. Fix it so that "
            f"`python -m pytest -q` passes, without changing the tests. Keep the public API as it is.\n\n"
            + _traceback(rng, target))
    id_prefix = "call_" if api == "openai" else "toolu_"
    counter = iter(range(10**6))

    def ids(m: int) -> list[str]:
        return [f"{id_prefix}{index:03d}{next(counter):04d}{rng.randrange(16**6):06x}" for _ in range(m)]

    steps = [_step(s, rng, files, int(_log_uniform(rng, *result_chars)), ids) for s in range(turns - 1)]
    return AgentSession(f"session-{index:03d}", api, AGENT_SYSTEM_PROMPT, AGENT_TOOLS, task, tuple(steps))


def _step(s: int, rng: random.Random, files: list[str], budget: int, ids) -> Step:
    """The s-th step of the loop: glob, read (two files at once), grep, test, then edit/test/read."""
    kind = ("glob", "read2", "grep", "test")[s] if s < 4 else ("edit", "test", "read")[(s - 4) % 3]
    text = rng.choice(_THOUGHTS)
    if kind == "glob":
        calls = [("glob", {"pattern": "**/*.py"})]
        results = ["\n".join(files + [f"src/{w}/{v}.py" for w in rng.sample(_WORDS, 6) for v in rng.sample(_WORDS, 4)])]
    elif kind == "read2":
        a, b = rng.sample(files, 2)
        calls = [("read_file", {"path": a}), ("read_file", {"path": b})]
        results = [_numbered(_python_module(rng, budget * 2 // 3)), _numbered(_python_module(rng, budget // 3))]
    elif kind == "read":
        path = rng.choice(files)
        calls = [("read_file", {"path": path})]
        results = [_numbered(_python_module(rng, budget))]
    elif kind == "grep":
        calls = [("grep", {"pattern": f"def {rng.choice(_WORDS)}_", "path": "src"})]
        results = [_grep(rng, files, budget)]
    elif kind == "test":
        calls = [("run_shell", {"command": "python -m pytest -q"})]
        results = [_pytest(rng, files, budget)]
    else:
        old = f"    for i in range(len({rng.choice(_WORDS)}s) - 1):"
        new = old.replace(" - 1)", ")")
        calls = [("edit_file", {"path": files[0], "old_string": old, "new_string": new})]
        results = [f"edited {files[0]}: 1 replacement\n" + _numbered(_python_module(rng, budget // 4))]
    call_ids = ids(len(calls))
    return Step(text, tuple(ToolCall(i, name, args) for i, (name, args) in zip(call_ids, calls)), tuple(results))


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _func(rng: random.Random) -> str:
    return f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}"


def _python_module(rng: random.Random, chars: int) -> str:
    lines = ['"""' + f"{rng.choice(_WORDS).title()} {rng.choice(_WORDS)}s and their {rng.choice(_WORDS)}s." + '"""',
             "", "from __future__ import annotations", "", "import os", "from dataclasses import dataclass", ""]
    size = sum(len(x) + 1 for x in lines)
    while size < chars:
        name, arg, other = _func(rng), rng.choice(_WORDS), rng.choice(_WORDS)
        block = [
            "", f"def {name}({arg}s: list[int], {other}: int = {rng.randrange(1, 64)}) -> list[int]:",
            f'    """Return the {arg}s grouped by {other}, skipping empty {rng.choice(_WORDS)}s."""',
            "    out = []",
            f"    for i in range(len({arg}s) - 1):",
            f"        if {arg}s[i] % {other} == {rng.randrange(8)}:",
            f"            out.append({arg}s[i] + {rng.randrange(100)})",
            "    return out", "",
        ]
        if rng.random() < 0.3:
            block += ["@dataclass", f"class {arg.title()}{other.title()}:", f"    {arg}: int = 0",
                      f"    {other}: str = {rng.choice(_WORDS)!r}", ""]
        lines += block
        size += sum(len(x) + 1 for x in block)
    return "\n".join(lines)[:chars]


def _numbered(text: str) -> str:
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(text.split("\n"), 1))


def _grep(rng: random.Random, files: list[str], chars: int) -> str:
    out, size = [], 0
    while size < chars:
        line = f"{rng.choice(files)}:{rng.randrange(1, 400)}:def {_func(rng)}({rng.choice(_WORDS)}s: list[int]) -> int:"
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)


def _traceback(rng: random.Random, path: str) -> str:
    func = _func(rng)
    return (f"Traceback (most recent call last):\n  File \"{path}\", line {rng.randrange(10, 300)}, in {func}\n"
            f"    return {rng.choice(_WORDS)}s[-1]\nIndexError: list index out of range")


def _pytest(rng: random.Random, files: list[str], chars: int) -> str:
    tests = [f for f in files if f.startswith("tests/")]
    head = ("============================= test session starts ==============================\n"
            "platform linux -- Python 3.12.3, pytest-8.3.4, pluggy-1.5.0\nrootdir: /workspace\n"
            f"collected {rng.randrange(20, 80)} items\n\n")
    lines = [head] + [f"{t} {''.join(rng.choice('..F.') for _ in range(rng.randrange(8, 30)))}\n" for t in tests]
    lines.append("\n=================================== FAILURES ===================================\n")
    size = sum(len(x) for x in lines)
    failed = 0
    while size < chars:
        test, func = rng.choice(tests), _func(rng)
        block = (f"___________________________ test_{func} ___________________________\n\n"
                 f"    def test_{func}():\n>       assert {func}([{rng.randrange(9)}, {rng.randrange(9)}]) == "
                 f"[{rng.randrange(99)}]\nE       assert [] == [{rng.randrange(99)}]\nE         Right contains one "
                 f"more item: {rng.randrange(99)}\n\n{test}:{rng.randrange(5, 200)}: AssertionError\n")
        lines.append(block)
        size += len(block)
        failed += 1
    lines.append(f"=========================== short test summary info ============================\n"
                 f"{failed} failed, {rng.randrange(10, 60)} passed in {rng.uniform(0.2, 9):.2f}s\n")
    return "".join(lines)
