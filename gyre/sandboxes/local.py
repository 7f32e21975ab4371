"""LocalSandbox: the CPU default; each command is a plain process group on this machine.

What it does: a fresh workspace directory per execution (starting files copied in, hidden
tests never); every command runs as `bash -c` in that directory, in its own process
group, with an environment built from scratch (see `gyre.sandboxes.process`: no host
secrets, HOME is the workspace, the execution's proxy URL/key passed explicitly), POSIX
rlimits (CPU seconds, file size, address space, open files) and a wall-clock timeout that
SIGKILLs the whole group. The workspace is kept after a timeout and after `close()`.

What it does NOT isolate yet (bubblewrap namespaces come in a later issue):
- the network: commands can reach the host's loopback and the internet;
- the filesystem outside the workspace: commands run as the same user as gyre and can
  read (and, permissions allowing, write) anything that user can, including other
  executions' workspaces and the benchmark's hidden tests if they know the path;
- processes: commands see the host's processes; a child that calls setsid() escapes the
  group kill;
- memory and CPU of a whole process tree (rlimits are per process; cgroups come later).
Use it for trusted models on a development box, not for untrusted code.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gyre.records import Query
from gyre.sandboxes.base import ExecResult, SandboxLimits
from gyre.sandboxes.paths import resolve_inside
from gyre.sandboxes.process import run_command, sandbox_env, signal_group


@dataclass
class LocalSandbox:
    """One execution's workspace and the commands run in it; see the module docstring."""

    workspace: Path
    env: dict[str, str]
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    closed: bool = field(default=False, init=False)
    _live_groups: set[int] = field(default_factory=set, init=False)

    @classmethod
    def create(
        cls,
        query: Query,
        workspace: Path,
        env: Mapping[str, str] | None = None,
        limits: SandboxLimits | None = None,
    ) -> LocalSandbox:
        """Make a fresh workspace for `query` (must not exist or be empty) and copy its starting files."""
        workspace = Path(workspace).resolve()
        if workspace.exists() and any(workspace.iterdir()):
            raise FileExistsError(f"workspace {workspace} already exists and is not empty")
        if query.start_dir is not None and Path(query.hidden_tests_dir).resolve().is_relative_to(
            Path(query.start_dir).resolve()
        ):
            raise ValueError(f"query {query.query_id}: hidden tests {query.hidden_tests_dir} lie inside start_dir")
        workspace.mkdir(parents=True, exist_ok=True)
        if query.start_dir is not None:
            shutil.copytree(query.start_dir, workspace, symlinks=True, dirs_exist_ok=True)
        return cls(workspace=workspace, env=sandbox_env(workspace, env), limits=limits or SandboxLimits())

    def exec(self, command: str, timeout_s: float) -> ExecResult:
        """Run `command` in the workspace. Background processes it leaves keep running until `close()`."""
        self._check_open()
        result = run_command(
            command,
            cwd=self.workspace,
            env=self.env,
            limits=self.limits,
            timeout_s=timeout_s,
            kill_leftovers=False,
            on_spawn=self._live_groups.add,
        )
        self._forget_finished_groups()
        return result

    def read_file(self, rel: str) -> str:
        return resolve_inside(self.workspace, rel).read_text(encoding="utf-8")

    def write_file(self, rel: str, content: str) -> None:
        target = resolve_inside(self.workspace, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")

    def close(self) -> None:
        """SIGKILL every process group this sandbox started that is still alive; keep the workspace."""
        self._forget_finished_groups()
        for pgid in self._live_groups:
            signal_group(pgid, signal.SIGKILL)
        self._live_groups.clear()
        self.closed = True

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.workspace)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"sandbox for {self.workspace} is closed")

    def _forget_finished_groups(self) -> None:
        # Dropping empty groups promptly matters: once a group has no members its id may be
        # reused by an unrelated process group, which close() must never signal.
        for pgid in list(self._live_groups):
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                self._live_groups.discard(pgid)
