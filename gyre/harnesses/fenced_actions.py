"""Actions written as fenced code blocks: what an instruct model without tool calling can drive.

Small instruct models (SmolLM2-135M, most base-then-SFT models under a few billion parameters)
were never tuned on a tool-call format: asked to use tools they answer in Markdown, code in
fenced blocks. Real agent harnesses meet such models where they are: mini-swe-agent takes one
```bash block per turn; aider's whole-file format takes a file's new content as a fenced block
with the file's path on the line before it. This module reads both from a reply:

- a ```bash (or ```sh, ```shell, ```console) block is a command to run;
- any other block that names a path is that file's whole new content. The path is named, first
  match wins, by the info string (```python calc.py, ```calc.py), by the block's first line when
  it is a comment holding only a path (`# calc.py`, `# file: calc.py`, `// main.js`; that line is
  kept in the file), or by the last non-blank line before the fence when that line is a path
  (aider: `calc.py`, `**calc.py**`, `` `calc.py`: ``) or holds exactly one backticked path
  ("Create `calc.py` with:");
- a block that names no path and is no command is no action, unless the harness has a default file
  (a single-file task set: `harness.text_default_file`): then the first such block writes it, as
  HumanEval-style evaluations take a reply's code block as the solution.

`parse` returns the actions in the order written and a format error for the model when a reply
holds code blocks but no action (what to do differently, as mini-swe-agent's format errors say).
A reply without any code block holds no action and no error: the agent is done.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console", "zsh"})
"""Info-string languages whose block is a command, not a file."""

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")
_PATH = re.compile(r"[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)*\.[A-Za-z0-9]{1,8}")
_COMMENT_PATH = re.compile(r"^\s*(?:#|//|--|;|<!--)\s*(?:file(?:name)?\s*:\s*)?(?P<path>\S+?)\s*(?:-->)?\s*$",
                           re.IGNORECASE)
_BACKTICKED = re.compile(r"`([^`\s]+)`")
_DECORATION = " \t*`'\":#>-"


@dataclass(frozen=True)
class WriteFile:
    path: str
    content: str


@dataclass(frozen=True)
class RunCommand:
    command: str


Action = WriteFile | RunCommand


@dataclass(frozen=True)
class Block:
    """One fenced block: its info string, body, and the non-blank text line written just before it."""

    info: str
    body: str
    line_before: str


@dataclass(frozen=True)
class Parsed:
    actions: list[Action]
    blocks: int
    """Fenced blocks in the reply, actions or not."""
    format_error: str | None
    """What the model is told when the reply had code but no action; None otherwise."""


def is_path(text: str) -> bool:
    """`text` is a relative file path with an extension (no spaces, no `..`, not absolute)."""
    return bool(_PATH.fullmatch(text)) and ".." not in text.split("/") and not text.startswith("/")


def blocks(reply: str) -> list[Block]:
    """The fenced blocks of `reply` (CommonMark fences: 3+ backticks or tildes; an unclosed block runs to the end)."""
    found: list[Block] = []
    lines = reply.split("\n")
    last_text = ""
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            if lines[i].strip():
                last_text = lines[i].strip()
            i += 1
            continue
        fence = opened.group("fence")
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = lines[i].strip()
            if close.startswith(fence[0] * len(fence)) and not close.strip(fence[0]):
                break
            body.append(lines[i])
            i += 1
        found.append(Block(opened.group("info").strip(), "\n".join(body), last_text))
        last_text = ""
        i += 1
    return found


def _path_before(line: str) -> str | None:
    """The path the line before a fence names: the whole line (decoration stripped), or its one backticked path."""
    bare = line.strip(_DECORATION)
    if is_path(bare):
        return bare
    named = {token.strip(_DECORATION) for token in _BACKTICKED.findall(line)}
    named = {token for token in named if is_path(token)}
    return named.pop() if len(named) == 1 else None


def block_path(block: Block) -> str | None:
    """The file a non-command block writes, or None when it names none."""
    words = block.info.split()
    for word in words[1:] if words and not is_path(words[0]) else words:
        if is_path(named := word.strip(_DECORATION)):
            return named
    comment = _COMMENT_PATH.match(block.body.split("\n", 1)[0])
    if comment and is_path(named := comment.group("path").strip(_DECORATION)):
        return named
    return _path_before(block.line_before) if block.line_before else None


def language(block: Block) -> str:
    words = block.info.split()
    return words[0].lower() if words else ""


def parse(reply: str, default_file: str | None = None) -> Parsed:
    """The actions `reply` asks for, in order, and a format error when it has code but no action.
    `default_file`: the first block that names no path (and is no command) writes it."""
    found = blocks(reply)
    actions: list[Action] = []
    defaulted = default_file is None
    for block in found:
        if language(block) in SHELL_LANGUAGES:
            if block.body.strip():
                actions.append(RunCommand(block.body))
            continue
        path = block_path(block)
        if path is None and not defaulted:
            path, defaulted = default_file, True
        if path is not None:
            content = block.body if block.body.endswith("\n") else block.body + "\n"
            actions.append(WriteFile(path, content))
    error = None
    if found and not actions:
        error = (f"Format error: your reply has {len(found)} code block(s) but no action. To write a file, put "
                 "its path on the line before the block or in the block's info string (```python calc.py); to "
                 "run a command, use a ```bash block. Reply without a code block when the task is done.")
    return Parsed(actions, len(found), error)
