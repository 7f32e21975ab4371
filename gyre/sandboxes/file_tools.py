"""A workspace file read or written for the agent (a harness's file tools), by the agent's own user inside its sandbox.

Why not from the host: gyre runs as root on our machines, and the agent controls the
workspace, including processes it left running that can swap a directory for a symlink to
a host path between a host-side check and the open that follows (seen: a host write into a
root-only 0700 directory after 41 tool calls). A read or write done by a command inside the
sandbox, as the sandbox's unprivileged user, can only reach what that user could reach
anyway: whatever the agent swaps, nothing outside the sandbox is touched, and a file written
belongs to the agent's user like every file its own commands write.

`read_file` runs `cat` there and refuses a file larger than a command's output bound (its
text would come back cut); `write_file` creates the parent directories and writes the
content from the command's standard input where the backend can pass one (`stdin=True`), else
base64 in the command line, `CHUNK_BYTES` of content a command (a command line argument is
bounded: 128 KiB on Linux). A path must be relative and free of `..`: the tools serve the
workspace, not the rest of the sandbox.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Callable
from pathlib import PurePosixPath

from gyre.sandboxes.base import ExecResult

FILE_TOOL_TIMEOUT_S = 30.0
"""How long one file tool's command may take in the sandbox."""
CHUNK_BYTES = 48 * 1024
"""Content per command when it travels in the command line (64 KiB of base64)."""

Exec = Callable[..., ExecResult]
"""A sandbox's `exec(command, timeout_s, [stdin=...])`."""


def checked(rel: str) -> str:
    """`rel` itself when it names a path inside the workspace (relative, no `..`); else ValueError."""
    path = PurePosixPath(rel)
    if not rel or path.is_absolute() or ".." in path.parts or "\0" in rel:
        raise ValueError(f"path {rel!r} must be relative to the workspace and must not contain '..'")
    return rel


def read_file(exec_: Exec, rel: str, max_bytes: int) -> str:
    """The text of workspace file `rel`, read by `cat` inside the sandbox."""
    q = shlex.quote(checked(rel))
    result = exec_(f"stat -L -c %s -- {q} >&2 && cat -- {q}", FILE_TOOL_TIMEOUT_S)
    if result.exit_code != 0 or result.timed_out:
        raise OSError(f"cannot read {rel}: {_why(result)}")
    size = int(result.stderr.split()[0])
    if size > max_bytes:
        raise ValueError(f"{rel} holds {size} bytes, more than a command may print ({max_bytes}): not read")
    return result.stdout


def write_file(exec_: Exec, rel: str, content: str, stdin: bool) -> None:
    """Write `content` to workspace file `rel` (parents created) by commands inside the sandbox."""
    q = shlex.quote(checked(rel))
    data = content.encode("utf-8")
    parents = f'mkdir -p -- "$(dirname -- {q})"'
    if stdin:
        _ok(rel, exec_(f"{parents} && cat > {q}", FILE_TOOL_TIMEOUT_S, stdin=data))
        return
    chunks = [data[i:i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
    for i, chunk in enumerate(chunks):
        encoded = shlex.quote(base64.b64encode(chunk).decode("ascii"))
        into = ">" if i == 0 else ">>"
        _ok(rel, exec_(f"{parents + ' && ' if i == 0 else ''}printf %s {encoded} | base64 -d {into} {q}",
                       FILE_TOOL_TIMEOUT_S))


def _ok(rel: str, result: ExecResult) -> None:
    if result.exit_code != 0 or result.timed_out:
        raise OSError(f"cannot write {rel}: {_why(result)}")


def _why(result: ExecResult) -> str:
    if result.timed_out:
        return f"timed out after {FILE_TOOL_TIMEOUT_S:g} s"
    return (result.stderr.strip() or result.stdout.strip() or f"exit code {result.exit_code}")[-500:]
