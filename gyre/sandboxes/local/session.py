"""A sandbox session that outlives its commands: a container's semantics, on the local sandbox.

Terminal-Bench and Harbor run an agent in a container and, after it stops, copy the
tests into that same container and run them there: a server the agent started in the
background is still listening when the tests call it. Per-command bubblewrap cannot do
that (each command's PID namespace dies with it). A `Session` keeps one set of
namespaces alive for a whole execution:

    keeper:  [cgroup] unshare+stage -> setpriv(uid KEEPER) -> bwrap ... sleep infinity
    command: [cgroup] prlimit -> nsenter(mount, uts, ipc, net, pid of the keeper, its root)
               -> setpriv(uid, no caps, no-new-privs) -> seccomp loader -> bash -c COMMAND

The keeper is the same bubblewrap sandbox every command gets (read-only system, no
network but its own loopback, the workspace at its workdir, the seccomp filter), started
once. Each command joins its namespaces as root (nothing else can: gyre must be root,
`available()`), drops to its user and loads the same seccomp filter (a few stdlib lines
run by the base interpreter, `SECCOMP_LOADER`) before bash starts. Processes a command
leaves running stay alive until `close()`; all of them live in the session's cgroup.

Two users, by design:
- agent commands run as the sandbox user (host uid 65534, `SANDBOX_USER`);
- the evaluation's commands run as `EVAL_USER` (host uid 65533), like the keeper. Processes
  the agent left running share the evaluation's namespaces, but not its uid: they cannot
  open the test process's files under /proc (its result pipe, its memory), signal it, or
  read the evaluation's slots (mode 0700), so the pristine tests they would adapt to and
  the result channel stay out of their reach.

Evaluation slots: the keeper binds, at creation, empty host directories owned by
`EVAL_USER` at the inside paths an evaluation needs (`/tests`, the plugin, the evaluation's
venv, its index bridge, Harbor's `/logs`). A mount namespace cannot take new binds from the
host later, so the evaluation writes into those host directories and the files appear
inside. The agent sees them empty and cannot write to them.

`close()` kills the keeper and every process of the session (its cgroup, then the PID
namespace's end), then removes the stage. If gyre itself dies, bubblewrap's
`--die-with-parent` ends the session: the keeper is started from one long-lived spawner
thread, because the kernel's parent-death signal follows the thread that forked.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from gyre.sandboxes import reaper
from gyre.sandboxes.base import ExecResult, SandboxLimits
from gyre.sandboxes.layout import Mount, SandboxLayout
from gyre.sandboxes.local.bwrap import SHM_DIR, bound_sources, bwrap_argv, prepare_scratch
from gyre.sandboxes.local.cgroups import create_cgroup
from gyre.sandboxes.local.cgroups_base import CommandCgroup, sigkill
from gyre.sandboxes.local.diskwatch import DiskWatch
from gyre.sandboxes.local.freeze import frozen
from gyre.sandboxes.local.privileges import SandboxUser, Stage, drop_argv, drop_tools, hand_over
from gyre.sandboxes.local.seccomp import seccomp_fd
from gyre.sandboxes.process import run_command, signal_group

EVAL_USER = SandboxUser(65533, 65533)
"""Host uid/gid of the keeper and of an in-place evaluation's commands (never the agent's)."""
KEEPER_START_TIMEOUT_S = 60.0
"""How long the keeper may take to report its PID (a loaded box starts bwrap slowly)."""
KEEPER_STOP_TIMEOUT_S = 10.0
SLOT_MODE = 0o700
SECCOMP_LOADER = r"""
import ctypes, os, sys
fd, workdir, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
prog = b""
while True:
    chunk = os.read(fd, 65536)
    if not chunk:
        break
    prog += chunk
os.close(fd)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
buf = ctypes.create_string_buffer(prog, len(prog))
fprog = Prog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
    sys.exit("gyre: cannot load the seccomp filter: " + os.strerror(ctypes.get_errno()))
os.chdir(workdir)
os.execvp(argv[0], argv)
"""
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gyre-session-spawner")


class SessionGone(RuntimeError):
    """The session's keeper is no longer running: its processes are gone."""


def available(bwrap: str | None, user: SandboxUser | None) -> bool:
    """Sessions need bubblewrap, gyre as root (to join namespaces and use two uids) and nsenter."""
    import shutil

    return bool(bwrap) and user is not None and shutil.which("nsenter") is not None and drop_tools() is not None


@dataclass
class Session:
    """One execution's long-lived namespaces; see the module docstring."""

    keeper: subprocess.Popen
    init_pid: int
    """Host PID of the sandbox's PID 1 (the namespaces commands join)."""
    workdir: str
    workspace: Path
    scratch: Path
    slots: dict[str, Path]
    """Slot name -> host directory shown at its inside path."""
    limits: SandboxLimits
    stage: Stage | None = None
    group: CommandCgroup | None = None
    closed: bool = field(default=False, init=False)
    spawned: list[int] = field(default_factory=list, init=False)
    """Process groups of the commands run (`reaper`-watched until the session ends)."""

    @classmethod
    def start(cls, *, bwrap: str, user: SandboxUser, workspace: Path, scratch: Path, layout: SandboxLayout,
              limits: SandboxLimits, slots: Mapping[str, str], slot_root: Path, cgroups: bool,
              extra_ro: Iterable[Path] = (), agent_dirs: Iterable[str] = ()) -> Session:
        """Start the keeper with `slots` (name -> inside path) bound from `slot_root/<name>`.

        `agent_dirs` ("slot/sub"): directories in a slot that belong to `user` (the slot then is
        root-owned, 0755, so the agent reaches them)."""
        prepare_scratch(scratch)
        scratch.chmod(0o1777)  # the evaluation's user writes /tmp too; the sticky bit keeps the agent's files its own
        for path in (scratch / SHM_DIR, workspace):
            hand_over(path, user, recursive=False)
        hand_over(scratch, user, recursive=False)
        slot_root.mkdir(parents=True, exist_ok=True)
        slot_dirs = {}
        for name in slots:
            directory = slot_root / name
            directory.mkdir(exist_ok=True)
            os.chown(directory, EVAL_USER.uid, EVAL_USER.gid)
            directory.chmod(SLOT_MODE)
            slot_dirs[name] = directory
        for rel in agent_dirs:
            name, _, sub = rel.partition("/")
            if name in slot_dirs and sub:
                os.chown(slot_dirs[name], 0, 0)
                slot_dirs[name].chmod(0o755)
                (slot_dirs[name] / sub).mkdir(parents=True, exist_ok=True)
                hand_over(slot_dirs[name] / sub, user, recursive=False)
        layout = SandboxLayout(workdir=layout.workdir, mounts=(
            *layout.mounts, *(Mount(slot_dirs[n], inside, writable=True) for n, inside in slots.items())))
        stage = Stage.create(bound_sources(workspace, scratch, layout, extra_ro))
        group = create_cgroup(limits) if cgroups else None
        read_info, write_info = os.pipe()
        seccomp = seccomp_fd()
        argv = drop_argv(EVAL_USER, stage, drop_tools())
        argv += bwrap_argv(bwrap, workspace=workspace, scratch=scratch, layout=layout, extra_ro=extra_ro,
                           source=stage.staged, seccomp_fd=seccomp)[:-1]
        argv += ["--info-fd", str(write_info), "--", "sleep", "infinity"]
        enter = group.enter_argv() if group else []
        try:
            keeper = _SPAWNER.submit(subprocess.Popen, [*enter, *argv], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                     pass_fds=(write_info, seccomp), env={"PATH": "/usr/bin:/bin"}).result()
        finally:
            os.close(write_info)
            os.close(seccomp)
        try:
            init_pid = _read_child_pid(read_info, keeper)
        except BaseException:
            _stop(keeper)
            stage.remove()
            if group is not None:
                group.remove()
            raise
        finally:
            os.close(read_info)
        return cls(keeper, init_pid, layout.inside(workspace), workspace, scratch, slot_dirs, limits, stage, group)

    def alive(self) -> bool:
        return not self.closed and self.keeper.poll() is None and os.path.exists(f"/proc/{self.init_pid}")

    def run(self, command: str, *, user: SandboxUser, env: Mapping[str, str], timeout_s: float,
            limits: SandboxLimits | None = None, own_cgroup: bool = False, interrupt_grace_s: float = 0.0,
            extra_fds: Iterable[int] = (), on_spawn: Callable[[int], None] | None = None,
            kill_leftovers: bool = False, stdin: bytes | None = None) -> ExecResult:
        """Run `command` as `user` inside the session; processes it leaves behind live on (unless
        `kill_leftovers`). `own_cgroup`: a fresh cgroup with `limits` instead of the session's.
        `stdin`: the command's standard input (None: empty)."""
        if not self.alive():
            raise SessionGone(f"the sandbox session of {self.workspace} has ended (its processes are gone)")
        limits = limits or self.limits
        group = create_cgroup(limits) if own_cgroup else self.group
        seccomp = seccomp_fd()
        confine = [
            "nsenter", f"--target={self.init_pid}", "--mount", "--uts", "--ipc", "--net", "--pid", "--root", "--",
            drop_tools()[1], f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
            _python(), "-I", "-S", "-c", SECCOMP_LOADER, str(seccomp), self.workdir,
        ]
        def spawned(pgid: int) -> None:
            self.spawned.append(pgid)
            if on_spawn is not None:
                on_spawn(pgid)

        try:
            return run_command(
                command, cwd=self.workspace, env=env, limits=limits, timeout_s=timeout_s,
                interrupt_grace_s=interrupt_grace_s, kill_leftovers=kill_leftovers, on_spawn=spawned,
                enter=group.enter_argv() if group else (), confine=confine, watch=DiskWatch(
                    [self.workspace, self.scratch], limits.max_workspace_bytes, limits.max_workspace_files),
                interrupt_descendants_only=True, pass_fds=(seccomp, *extra_fds), stdin=stdin,
            )
        finally:
            os.close(seccomp)
            if own_cgroup and group is not None:
                group.remove()

    def frozen(self) -> AbstractContextManager[set[int]]:
        """Every process of the session stopped for a block (`gyre.sandboxes.local.freeze`): root work
        on its workspace (an in-place evaluation's ACL grant) while nothing of the agent runs."""
        return frozen(self.init_pid)

    def close(self) -> None:
        """Kill every process of the session and the keeper; the workspace stays."""
        if self.closed:
            return
        self.closed = True
        if self.group is not None:
            sigkill(self.group.pids())
        _stop(self.keeper)
        if self.group is not None:
            self.group.remove()
        if self.stage is not None:
            self.stage.remove()
        for pgid in self.spawned:  # all dead with the session: never signal those ids again
            reaper.forget(pgid)


def _python() -> str:
    """The base interpreter (bound in every sandbox) that runs the seccomp loader."""
    return os.path.realpath(os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}"))


def _read_child_pid(fd: int, keeper: subprocess.Popen) -> int:
    """The `child-pid` bubblewrap writes on its info fd, or RuntimeError with the keeper's stderr."""
    deadline = time.monotonic() + KEEPER_START_TIMEOUT_S
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            chunk = os.read(fd, 4096)
            data += chunk
            try:
                pid = int(json.loads(data)["child-pid"])
            except (ValueError, KeyError):
                if not chunk:
                    break
                continue
            if _wait_ready(pid, deadline, keeper):
                return pid
            break
        elif keeper.poll() is not None:
            break
    _stop(keeper)
    stderr = keeper.stderr.read().decode("utf-8", errors="replace")[-600:] if keeper.stderr else ""
    raise RuntimeError(f"sandbox session keeper did not start (exit {keeper.returncode}): {stderr}")


def _wait_ready(pid: int, deadline: float, keeper: subprocess.Popen) -> bool:
    """Wait for the sandbox's command (`sleep`) to run: bubblewrap reports its PID before the mounts are done."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    while time.monotonic() < deadline and keeper.poll() is None:
        try:
            kids = children.read_text().split()
            if kids and Path(f"/proc/{kids[0]}/comm").read_text().strip() == "sleep":
                return True
        except OSError:
            pass
        time.sleep(0.01)
    return False


def _stop(keeper: subprocess.Popen) -> None:
    signal_group(keeper.pid, signal.SIGKILL)
    try:
        keeper.wait(timeout=KEEPER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    if keeper.stderr is not None:
        keeper.stderr.close()

