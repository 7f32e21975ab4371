"""The sandbox contract: where an execution's agent runs its commands and edits files.

A harness (Claude Code, mini-swe-agent, a script) drives one execution inside one
sandbox. Everything it needs is here: run a shell command with a timeout, read and write
files in the workspace, close. Backends differ in how they isolate: `LocalSandbox` (the
default: bubblewrap namespaces + cgroups v1 + rlimits when `bwrap` is installed, plain
process groups + rlimits with a loud warning otherwise) and `DockerSandbox` (the docker
SDK, imported only inside its own module), each behind this same Protocol.

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


class SandboxStartError(RuntimeError):
    """An execution's sandbox could not start for a reason that is not the agent's (the task's image did not
    build, the engine refused the container): the execution is recorded with it and dropped, the run goes on."""


class SandboxLostError(RuntimeError):
    """An execution's sandbox stopped answering mid-execution for a reason that is not the agent's (the docker
    engine died): the execution is recorded `sandbox_error` with it and dropped, never scored, the run goes on.
    Not an `OSError`, so no harness tool turns it into an observation for the model."""


@dataclass(frozen=True)
class ExecResult:
    """What one command did. `exit_code` is negative (-signal) when a signal killed it."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    limit_hit: str | None = None
    """Set when gyre killed the command for a limit other than the timeout (workspace too big, ...)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits applied to every command.

    rlimits (`cpu_s`, `max_file_bytes`, `address_space_bytes`, `max_open_files`) bind each
    process separately. The tree-wide limits (`max_processes`, `memory_bytes`, `cpu_cores`)
    need cgroups (v1, or v2 with a delegated parent: `gyre.sandboxes.local.cgroups`); without them only the rlimits
    and the wall-clock timeout hold. `max_workspace_bytes` / `max_workspace_files` are
    enforced by polling the writable directories (no disk quotas needed).
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
    max_processes: int = 512
    """Processes + threads of one command's whole tree (cgroup pids.max); a fork bomb stops here."""
    memory_bytes: int = 8 << 30
    """Memory of one command's whole tree, page cache and /tmp included (cgroup memory limit)."""
    cpu_cores: float = 2.0
    """CPU share of one command's whole tree, in cores (cgroup CFS quota)."""
    max_workspace_bytes: int = 4 << 30
    """Bytes in the writable directories (workspace, scratch); the command is killed beyond it."""
    max_workspace_files: int = 200_000
    """Files + directories in the writable directories; the command is killed beyond it."""

    def __post_init__(self) -> None:
        for name in ("cpu_s", "max_file_bytes", "address_space_bytes", "max_open_files", "max_output_bytes",
                     "max_processes", "memory_bytes", "max_workspace_bytes", "max_workspace_files"):
            if getattr(self, name) < 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1, got {getattr(self, name)}")
        if not self.cpu_cores > 0:
            raise ValueError(f"SandboxLimits.cpu_cores must be > 0, got {self.cpu_cores}")


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
