"""How a local command is confined: bubblewrap + cgroups when the host allows, else plain, loudly.

Both the agent's commands (`LocalSandbox.exec`) and the evaluator's hidden-test commands
(code written by the agent runs inside them) go through `Isolation.run`, so both get the
same walls. One command's full wrapping, outermost first:

    /bin/sh (join a fresh cgroup, v1 or delegated v2: pids, memory, cpu)   gyre.sandboxes.local.cgroups
      prlimit (rlimits: CPU s, file size, address space, open files)   gyre.sandboxes.process
        [gyre as root: unshare + staging binds, then setpriv to uid 65534]   gyre.sandboxes.local.privileges
          bwrap (namespaces, read-only system, writable workspace, seccomp)   gyre.sandboxes.local.bwrap
            bash -c COMMAND

plus a `DiskWatch` polling the writable directories, and the wall-clock timeout that
kills the process group (and with it bwrap, whose PID namespace takes every descendant
along). After the command the cgroup is emptied with SIGKILL and removed, so nothing the
command started outlives it.

Modes (`Isolation.detect(mode)`): `auto` uses bubblewrap when a probe run works, else
falls back to `none` with a loud warning; `bwrap` insists (RuntimeError if unusable);
`none` is plain process groups. Without bubblewrap there is no network, filesystem or
PID isolation: commands run as gyre's user and can read whatever it can. cgroups are used
in every mode where they work; where they do not, a fork bomb or a many-process memory
bomb is bounded only by rlimits (RLIMIT_NPROC for a non-root user) and the timeout, and
the warning says so.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gyre.sandboxes.base import ExecResult, SandboxLimits
from gyre.sandboxes.layout import SandboxLayout
from gyre.sandboxes.local.bwrap import SHM_DIR, bound_sources, bwrap_argv, find_bwrap, prepare_scratch
from gyre.sandboxes.local.cgroups import create_cgroup
from gyre.sandboxes.local.cgroups_base import CommandCgroup
from gyre.sandboxes.local.diskwatch import DiskWatch
from gyre.sandboxes.local.privileges import SandboxUser, Stage, drop_argv, drop_tools, hand_over, sandbox_user
from gyre.sandboxes.local.seccomp import seccomp_fd
from gyre.sandboxes.process import run_command

log = logging.getLogger("gyre.sandboxes")
MODES = ("auto", "bwrap", "none")
_PROBE_TIMEOUT_S = 10


@dataclass(frozen=True)
class Isolation:
    """The confinement every local command gets; see the module docstring."""

    bwrap: str | None
    """Path of bwrap, or None for plain process groups."""
    cgroups: bool
    """Whether each command gets its own cgroup (v1, or v2 under a delegated parent: pids, memory, cpu)."""
    user: SandboxUser | None = None
    """The unprivileged host user bubblewrap runs as (gyre is root), or None (already unprivileged)."""

    @property
    def mode(self) -> str:
        return "bwrap" if self.bwrap else "none"

    @classmethod
    def detect(cls, mode: str = "auto") -> Isolation:
        if mode not in MODES:
            raise ValueError(f"sandbox isolation must be one of {', '.join(MODES)}, got {mode!r}")
        cgroups = cgroups_usable()
        bwrap = probe_bwrap() if mode != "none" else None
        if mode == "bwrap" and bwrap is None:
            raise RuntimeError("sandbox isolation 'bwrap' asked for, but bwrap is missing or unusable "
                               "(apt-get install -y bubblewrap util-linux; it needs user namespaces)")
        if mode == "auto" and bwrap is None and os.geteuid() == 0:
            raise RuntimeError("sandbox isolation 'auto' found no usable bubblewrap, and gyre runs as root: agent "
                               "code would run as root with no confinement. Install it (bash scripts/system-deps.sh; "
                               "it needs user namespaces), or set sandbox.isolation: none to run it so on purpose")
        isolation = cls(bwrap=bwrap, cgroups=cgroups, user=sandbox_user() if bwrap else None)
        _warn_once(isolation)
        return isolation

    def run(
        self,
        command: str,
        *,
        workspace: Path,
        scratch: Path,
        layout: SandboxLayout,
        env: Mapping[str, str],
        limits: SandboxLimits,
        timeout_s: float,
        interrupt_grace_s: float = 0.0,
        on_spawn: Callable[[int], None] | None = None,
        extra_ro: Iterable[Path] = (),
        extra_fds: Iterable[int] = (),
        python_dirs: Iterable[Path] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run `command` confined; every process it started is dead when this returns.

        `extra_fds` stay open into the command (an evaluator's result channel); the caller owns them.
        `stdin`: the command's standard input (None: empty).
        `python_dirs`: the interpreter directories shown (default gyre's own; evaluations show only the base one).
        """
        if self.bwrap is None and layout.needs_namespaces(workspace):
            raise RuntimeError(f"this task expects its files at {layout.inside(workspace)} and mounts "
                               f"{[m.target for m in layout.mounts]}: that needs bubblewrap (or docker)")
        writable = [workspace, scratch, *(m.source for m in layout.mounts if m.writable)]
        watch = DiskWatch(writable, limits.max_workspace_bytes, limits.max_workspace_files)
        confine, stage, pass_fds = self._confinement(workspace, scratch, layout, extra_ro, python_dirs)
        group = create_cgroup(limits) if self.cgroups else None
        try:
            result = run_command(
                command,
                cwd=workspace,
                env=env,
                limits=limits,
                timeout_s=timeout_s,
                interrupt_grace_s=interrupt_grace_s,
                kill_leftovers=True,
                on_spawn=on_spawn,
                enter=group.enter_argv() if group else (),
                confine=confine,
                watch=watch,
                nproc_rlimit=self.bwrap is None and os.geteuid() != 0,
                interrupt_descendants_only=self.bwrap is not None,
                pass_fds=(*pass_fds, *extra_fds),
                stdin=stdin,
            )
            if group is not None and result.limit_hit is None:
                result = _with_cgroup_verdict(result, group, limits)
        finally:
            for fd in pass_fds:
                os.close(fd)
            if stage is not None:
                stage.remove()
            if group is not None:
                group.remove()
        return result

    def _confinement(self, workspace: Path, scratch: Path, layout: SandboxLayout, extra_ro: Iterable[Path],
                     python_dirs: Iterable[Path] | None) -> tuple[list[str], Stage | None, tuple[int, ...]]:
        """The argv prefix that confines a command (the privilege drop, then bubblewrap with the
        seccomp filter), the staging mount namespace it uses, and the fds it needs open; nothing
        without bubblewrap."""
        if not self.bwrap:
            return [], None, ()
        prepare_scratch(scratch)
        for path in (scratch, scratch / SHM_DIR, workspace, *(m.source for m in layout.mounts if m.writable)):
            hand_over(path, self.user, recursive=False)
        confine: list[str] = []
        stage: Stage | None = None
        if self.user is not None:
            stage = Stage.create(bound_sources(workspace, scratch, layout, extra_ro, python_dirs))
            confine = drop_argv(self.user, stage, _drop_tools())
        pass_fds = (seccomp_fd(),)
        confine += bwrap_argv(self.bwrap, workspace=workspace, scratch=scratch, layout=layout, extra_ro=extra_ro,
                              source=stage.staged if stage else lambda p: p, seccomp_fd=pass_fds[0],
                              python_dirs=python_dirs)
        return confine, stage, pass_fds

    def hand_over(self, path: Path) -> None:
        """Give `path` and everything under it to the user sandboxed commands run as (a no-op unless dropping)."""
        hand_over(path, self.user)


@lru_cache(maxsize=1)
def cgroups_usable() -> bool:
    group = create_cgroup(SandboxLimits())
    if group is None:
        return False
    group.remove()
    return True


@lru_cache(maxsize=1)
def probe_bwrap() -> str | None:
    """Path of bwrap if a confined `true` runs the way every command will (dropped when root), else None."""
    bwrap = find_bwrap()
    if bwrap is None:
        return None
    user = sandbox_user()
    if user is not None and drop_tools() is None:
        log.warning("bwrap unusable: gyre runs as root and cannot drop to an unprivileged uid without "
                    "util-linux's unshare and setpriv")
        return None
    probe = Isolation(bwrap=bwrap, cgroups=False, user=user)
    with tempfile.TemporaryDirectory(prefix="gyre-probe-") as tmp:
        workspace, scratch = Path(tmp, "ws"), Path(tmp, "tmp")
        workspace.mkdir()
        try:
            done = probe.run("true", workspace=workspace, scratch=scratch, layout=SandboxLayout(), env={},
                             limits=SandboxLimits(), timeout_s=_PROBE_TIMEOUT_S)
        except OSError as exc:
            log.warning("bwrap probe failed: %s", exc)
            return None
    if done.exit_code != 0:
        log.warning("bwrap probe failed (exit %s): %s", done.exit_code, done.stderr[-400:])
        return None
    return bwrap


def _drop_tools() -> tuple[str, str]:
    tools = drop_tools()
    if tools is None:
        raise RuntimeError("gyre runs as root and needs util-linux's unshare and setpriv to drop privileges")
    return tools


def _with_cgroup_verdict(result: ExecResult, group: CommandCgroup, limits: SandboxLimits) -> ExecResult:
    """Name the cgroup limit a killed or failing command ran into, if any."""
    reasons = []
    if group.memory_limit_hits() > 0:
        reasons.append(f"memory limit ({limits.memory_bytes} bytes) reached")
    if group.pids_limit_hits() > 0:
        reasons.append(f"process limit ({limits.max_processes}) reached")
    if not reasons:
        return result
    return ExecResult(result.exit_code, result.stdout, result.stderr, result.timed_out, result.duration_s,
                      "; ".join(reasons))


_warned: set[tuple[str | None, bool]] = set()


def _warn_once(isolation: Isolation) -> None:
    key = (isolation.bwrap, isolation.cgroups)
    if key in _warned:
        return
    _warned.add(key)
    if isolation.bwrap is None:
        log.warning(
            "\n%s\nGYRE SANDBOX WARNING: bubblewrap is not in use. Agent commands run as this user with NO "
            "network, filesystem or PID isolation: they can reach the network, read other workspaces and "
            "the hidden tests. Applied: scrubbed env, rlimits, timeouts%s. Install it: apt-get install -y "
            "bubblewrap\n%s", "!" * 78, ", cgroup limits" if isolation.cgroups else " (no cgroups)", "!" * 78,
        )
    if not isolation.cgroups:
        log.warning("gyre sandbox: cgroups unusable here (no cgroup v1, no delegated cgroup v2 parent: see "
                    "gyre.sandboxes.local.cgroups_v2); process and memory limits are per process only")
