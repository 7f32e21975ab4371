"""The sandbox contract: where an execution's agent runs its commands and edits files.

A harness (Claude Code, mini-swe-agent, a script) drives one execution inside one
sandbox. Everything it needs is here: run a shell command with a timeout, read and write
files in the workspace, close. Backends differ in how well they isolate: `LocalSandbox`
(plain process groups + rlimits, the CPU default) today; bubblewrap namespaces and Docker
later, each behind this same Protocol and imported only inside its own module.

Two rules every backend keeps:
- The workspace directory outlives the sandbox. `close()` stops processes and keeps the
  files, because an execution that timed out is still scored on what it left (partial
  artifacts); only an explicit `destroy()` deletes them.
- Output is bounded: stdout and stderr are each cut to `SandboxLimits.max_output_bytes`
  (head and tail kept, a marker in between), so a runaway `yes` cannot flood memory or
  the model's context.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024


@dataclass(frozen=True)
class ExecResult:
    """What one command did. `exit_code` is negative (-signal) when a signal killed it."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float


@dataclass(frozen=True)
class SandboxLimits:
    """Per-process resource limits applied to every command (POSIX rlimits).

    rlimits bind each process separately, not the command's whole process tree; the
    wall-clock timeout of `exec` is what bounds a tree. cgroups (bubblewrap backend) come later.
    """

    cpu_s: int = 600
    """CPU seconds per process (RLIMIT_CPU); SIGXCPU at the limit, SIGKILL one second later."""
    max_file_bytes: int = 1 << 30
    """Largest file a process may write (RLIMIT_FSIZE), 1 GiB; beyond it the write fails (SIGXFSZ)."""
    address_space_bytes: int = 8 << 30
    """Virtual memory per process (RLIMIT_AS), 8 GiB; allocations beyond it fail."""
    max_open_files: int = 1024
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    """Bytes kept of each of stdout and stderr; the rest is replaced by a truncation marker."""

    def __post_init__(self) -> None:
        for name in ("cpu_s", "max_file_bytes", "address_space_bytes", "max_open_files", "max_output_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1, got {getattr(self, name)}")


@runtime_checkable
class Sandbox(Protocol):
    """Where one execution's commands run. Paths given to read/write are workspace-relative."""

    workspace: Path

    def exec(self, command: str, timeout_s: float) -> ExecResult:
        """Run `command` with bash in the workspace; on timeout kill it and return what it printed."""
        ...

    def read_file(self, rel: str) -> str:
        """Text of a workspace file; ValueError if `rel` escapes the workspace."""
        ...

    def write_file(self, rel: str, content: str) -> None:
        """Write a workspace file (parents created); ValueError if `rel` escapes the workspace."""
        ...

    def close(self) -> None:
        """Stop everything still running; the workspace is kept."""
        ...

    def destroy(self) -> None:
        """Close, then delete the workspace."""
        ...
