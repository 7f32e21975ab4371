"""LocalSandbox: the default backend; each command confined on this machine, no daemon needed.

What it does: a fresh workspace directory per execution (starting files copied in, hidden
tests never; a starting git repository is stripped to the history reachable from HEAD,
see `gyre.sandboxes.git_history`), a per-sandbox scratch directory shown as `/tmp`, and
every command run as `bash -c` through `gyre.sandboxes.local.isolation`: with bubblewrap
(the default when installed) in its own user, PID, network, mount, IPC and UTS
namespaces, as an unprivileged host uid when gyre is root (`gyre.sandboxes.local.privileges`),
under a seccomp filter (`gyre.sandboxes.local.seccomp`), seeing a read-only system, only its own
workspace writable, no network but its own loopback, and nothing else of the host; in a fresh cgroup v1 (processes, memory,
CPU of the whole tree) where cgroups work; under rlimits always; with an environment built
from scratch (`gyre.sandboxes.process.sandbox_env`: no host secrets, HOME is the
workspace, the execution's proxy URL/key passed explicitly); and killed, with every
process it started, at its wall-clock timeout. The workspace is kept after a timeout,
after `close()` and after a limit kill; `destroy()` deletes it.

Every process a command starts ends with that command (PID namespace, cgroup): state
that must outlive a command lives in the workspace. Except in session mode
(`session_slots`, used for Terminal-Bench and Harbor): all commands join one long-lived
`gyre.sandboxes.local.session.Session`, processes they leave running stay alive until `close()`,
and `end_agent()` stops the agent (its commands, its proxy bridge) while keeping them for
an in-place evaluation (`gyre.evaluators.formats.in_place`). A harness that runs inside the
sandbox (Claude Code, mini-swe-agent, a script) therefore runs as one long command, and
reaches the proxy through `gyre.sandboxes.bridge`, the only way out of its network
namespace.

Without bubblewrap (`isolation="none"`, or `auto` on a host without it) a loud warning is
logged once and there is NO network, filesystem or PID isolation: use it for trusted
models on a development box only. Tasks that expect fixed paths (`/app`) then fail with a
clear error instead of running in the wrong place.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from gyre.records import Query
from gyre.sandboxes import file_tools
from gyre.sandboxes.base import ExecResult, SandboxLimits
from gyre.sandboxes.bridge import INSIDE_DIR, ProxyBridge, proxy_address
from gyre.sandboxes.fdwalk import strip_special_bits
from gyre.sandboxes.git_history import strip_git_history
from gyre.sandboxes.layout import Mount, SandboxLayout
from gyre.sandboxes.local.isolation import Isolation
from gyre.sandboxes.local.session import Session, SessionGone
from gyre.sandboxes.paths import remove_tree, resolve_inside
from gyre.sandboxes.process import kill_group, sandbox_env

SESSION_SUFFIX = ".session"

SCRATCH_SUFFIX = ".tmp"


@dataclass
class LocalSandbox:
    """One execution's workspace and the commands run in it; see the module docstring."""

    workspace: Path
    env: dict[str, str]
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    isolation: Isolation = field(default_factory=Isolation.detect)
    layout: SandboxLayout = field(default_factory=SandboxLayout)
    extra_ro: tuple[Path, ...] = ()
    """Host paths shown read-only inside (a harness's own installation, the proxy bridge)."""
    session_slots: dict[str, str] | None = None
    """Set: one long-lived session for all commands (`gyre.sandboxes.local.session`), with these evaluation
    slots (name -> inside path); processes a command leaves running live on until `close()`."""
    closed: bool = field(default=False, init=False)
    agent_dirs: tuple[str, ...] = ()
    """Directories inside session slots that belong to the agent ("logs/agent")."""
    session_restarts: int = field(default=0, init=False)
    """Times the session had ended (its processes killed from inside) and a new one was started."""
    _session: Session | None = field(default=None, init=False)
    _live_groups: set[int] = field(default_factory=set, init=False)
    _bridge: ProxyBridge | None = field(default=None, init=False)

    @classmethod
    def create(
        cls,
        query: Query,
        workspace: Path,
        env: Mapping[str, str] | None = None,
        limits: SandboxLimits | None = None,
        *,
        isolation: Isolation | str = "auto",
        layout: SandboxLayout | None = None,
        extra_ro: Iterable[Path] = (),
        session_slots: Mapping[str, str] | None = None,
        agent_dirs: Iterable[str] = (),
    ) -> LocalSandbox:
        """Make a fresh workspace for `query` (must not exist or be empty) and copy its starting files."""
        workspace = Path(workspace).resolve()
        if workspace.exists() and any(workspace.iterdir()):
            raise FileExistsError(f"workspace {workspace} already exists and is not empty")
        if query.start_dir is not None and Path(query.hidden_tests_dir).resolve().is_relative_to(
            Path(query.start_dir).resolve()
        ):
            raise ValueError(f"query {query.query_id}: hidden tests {query.hidden_tests_dir} lie inside start_dir")
        if isinstance(isolation, str):
            isolation = Isolation.detect(isolation)
        layout = layout or SandboxLayout()
        workspace.mkdir(parents=True, exist_ok=True)
        if query.start_dir is not None:
            shutil.copytree(query.start_dir, workspace, symlinks=True, dirs_exist_ok=True)
            strip_git_history(workspace)
        isolation.hand_over(workspace)
        home = layout.inside(workspace)
        return cls(
            workspace=workspace,
            env=sandbox_env(Path(home), env),
            limits=limits or SandboxLimits(),
            isolation=isolation,
            layout=layout,
            extra_ro=tuple(Path(p) for p in extra_ro),
            session_slots=dict(session_slots) if session_slots is not None else None,
            agent_dirs=tuple(agent_dirs),
        )

    @property
    def scratch(self) -> Path:
        """Host directory shown as /tmp inside (bubblewrap); next to the workspace, never scored."""
        return self.workspace.parent / f".{self.workspace.name}{SCRATCH_SUFFIX}"

    @property
    def workdir(self) -> str:
        """The workspace's path as commands see it."""
        return self.layout.inside(self.workspace)

    def exec(self, command: str, timeout_s: float, stdin: bytes | None = None) -> ExecResult:
        """Run `command` in the workspace; it and everything it started are gone when this returns
        (in session mode, what it leaves running lives on). `stdin`: its standard input."""
        self._check_open()
        self.scratch.mkdir(exist_ok=True)
        spawned: list[int] = []

        def on_spawn(pgid: int) -> None:
            spawned.append(pgid)
            self._live_groups.add(pgid)

        if self.session_slots is not None:
            try:
                return self.session().run(command, user=self.isolation.user, env=self.env, timeout_s=timeout_s,
                                          on_spawn=on_spawn, stdin=stdin)
            except SessionGone:  # a command of the agent's own ended the session: start over, processes lost
                return self.session().run(command, user=self.isolation.user, env=self.env, timeout_s=timeout_s,
                                          on_spawn=on_spawn, stdin=stdin)
            finally:
                self._live_groups.difference_update(spawned)
        try:
            return self.isolation.run(
                command,
                workspace=self.workspace,
                scratch=self.scratch,
                layout=self.layout,
                env=self.env,
                limits=self.limits,
                timeout_s=timeout_s,
                on_spawn=on_spawn,
                extra_ro=self.extra_ro,
                stdin=stdin,
            )
        finally:  # a finished group's id may be reused by an unrelated group: never signal it later
            self._live_groups.difference_update(spawned)

    @property
    def slot_root(self) -> Path:
        """Host directory holding the session's evaluation slots (next to the workspace, never scored)."""
        return self.workspace.parent / f".{self.workspace.name}{SESSION_SUFFIX}"

    def session(self) -> Session:
        """The running session (started on first use, or again after it ended); session mode only."""
        if self.session_slots is None:
            raise RuntimeError("this sandbox runs each command in its own namespaces (no session_slots)")
        self._check_open()
        if self._session is not None and self._session.alive():
            return self._session
        if self._session is not None:  # it ended: what ran there is gone
            self._session.close()
            self.session_restarts += 1
        self.scratch.mkdir(exist_ok=True)
        self._session = Session.start(
            bwrap=self.isolation.bwrap, user=self.isolation.user, workspace=self.workspace, scratch=self.scratch,
            layout=self.layout, limits=self.limits, slots=self.session_slots, slot_root=self.slot_root,
            cgroups=self.isolation.cgroups, extra_ro=self.extra_ro, agent_dirs=self.agent_dirs)
        return self._session

    def end_agent(self) -> None:
        """The agent is done: its commands and its way to the proxy end; in session mode the processes
        it left running stay for an in-place evaluation (then `close()`)."""
        for pgid in list(self._live_groups):
            kill_group(pgid)
        self._live_groups.clear()
        self._close_bridge()

    def open_proxy(self, base_url: str) -> str:
        """Let commands reach the proxy at `base_url` (and nothing else); returns a shell prefix for them.

        With bubblewrap this starts the bridge (`gyre.sandboxes.bridge`) once and mounts its
        socket; a command that should reach the proxy starts with the returned prefix. Without
        bubblewrap the host network is shared anyway and the prefix is empty.
        """
        if self.isolation.bwrap is None:
            return ""
        if self._bridge is None:
            if self._session is not None:
                raise RuntimeError("open the proxy before the sandbox's first command: a session's mounts are fixed")
            self._bridge = ProxyBridge(proxy_address(base_url)).start()
            mount = Mount(self._bridge.directory, INSIDE_DIR)
            self.layout = replace(self.layout, mounts=(*self.layout.mounts, mount))
        elif self._bridge.target != proxy_address(base_url):
            raise ValueError(f"sandbox already bridged to {self._bridge.target}, not {base_url}")
        return self._bridge.shell_prefix()

    def read_file(self, rel: str) -> str:
        """A workspace file's text, read by `cat` inside the sandbox as its user (`gyre.sandboxes.file_tools`);
        ValueError if `rel` leads out of the workspace (checked first, for a clear error: the read
        itself cannot reach out, whatever a running process swaps meanwhile)."""
        resolve_inside(self.workspace, rel)
        return file_tools.read_file(self.exec, rel, self.limits.max_output_bytes)

    def write_file(self, rel: str, content: str) -> None:
        """Write a workspace file (parents created) by a command inside the sandbox as its user, so the
        agent's commands can change it and nothing outside is ever written (`gyre.sandboxes.file_tools`)."""
        resolve_inside(self.workspace, rel)
        file_tools.write_file(self.exec, rel, content, stdin=True)

    def close(self) -> None:
        """Kill commands still running (from other threads); keep the workspace, drop the scratch dir."""
        for pgid in list(self._live_groups):
            kill_group(pgid)
        self._live_groups.clear()
        if self._session is not None:
            self._session.close()
            self._session = None
        self._close_bridge()
        remove_tree(self.scratch)
        remove_tree(self.slot_root)
        strip_special_bits(self.workspace)  # every process is dead: nothing it marked setuid stays runnable
        self.closed = True

    def _close_bridge(self) -> None:
        if self._bridge is not None:
            self._bridge.close()
            shutil.rmtree(self._bridge.directory, ignore_errors=True)
            self._bridge = None

    def destroy(self) -> None:
        self.close()
        remove_tree(self.workspace)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"sandbox for {self.workspace} is closed")
