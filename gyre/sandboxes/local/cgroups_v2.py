"""cgroup v2: the same per-command limits as `gyre.sandboxes.local.cgroups` on a unified-hierarchy host.

Why: most current hosts mount only cgroup v2 at /sys/fs/cgroup, where the v1 code finds
no `pids`/`memory`/`cpu` hierarchies and a fork bomb or a many-process memory bomb is
bounded only by rlimits. This module gives each command a fresh v2 cgroup with the
same three tree-wide limits, the same `/bin/sh` join prefix and the same sure kill.

The "no internal processes" rule. In v2 a non-root cgroup may either hold processes or
hand its domain controllers (memory, pids, cpu) down to children via
`cgroup.subtree_control`, never both: enabling a controller in a cgroup that has
processes in it fails with EBUSY (only the true root cgroup is exempt, not the root of a
container's cgroup namespace). gyre's own process sits in its own cgroup, so that cgroup
normally cannot be the parent of the command cgroups. gyre never moves its own process to
make room (that would change how the host accounts for gyre, behind its back). Instead it
needs a *delegated parent*, taken from exactly one place:

1. `$GYRE_CGROUP_V2_PARENT`, when set: a cgroup of the v2 hierarchy, written as
   /proc/self/cgroup writes paths (`/gyre.slice`, `/user.slice/user-1000.slice/user@1000.service/gyre`),
   resolved against the cgroup2 mount (default /sys/fs/cgroup; a full path under it is
   accepted too). It must exist, hold no processes, have memory, pids and cpu in its
   `cgroup.controllers`, and be writable by gyre's user. For a non-root gyre the kernel
   also lets the command move itself there only when gyre's user may write
   `cgroup.procs` of the common ancestor of gyre's cgroup and that parent, i.e. both lie
   in one delegated subtree. Typical setups: a systemd unit with `Delegate=yes` and
   `DelegateSubgroup=supervisor` (gyre runs in `<unit>/supervisor`; point the variable
   at `<unit>`), or a cgroup an administrator made and chowned to gyre's user.
2. Otherwise gyre's own cgroup (the `0::/path` line of /proc/self/cgroup), used only if
   memory, pids and cpu are already enabled in its `cgroup.subtree_control` or writing
   them there succeeds. Because gyre's own process is in it, in practice this works only
   when that cgroup is the true root of the hierarchy (gyre started in `/`); inside a
   delegated unit or a container's cgroup namespace the kernel answers EBUSY, and the
   variable above is the way.

Otherwise (no cgroup2 mount at the root, the parent missing, a controller not delegated
to it, `cgroup.subtree_control` refused: EBUSY, EACCES, EROFS) `CgroupV2.create` returns
None and logs one warning line saying which and why; the caller then runs commands
without tree-wide limits (per-process rlimits only) and warns about that too.

Per command (`CgroupV2.create`): a child `gyre-<hex>` of the parent, with memory, pids
and cpu enabled in the parent's `cgroup.subtree_control` if they were not yet (they stay
enabled for the next command), and

- `memory.max` = `SandboxLimits.memory_bytes` (anonymous memory, page cache, tmpfs);
- `memory.swap.max` = 0 where swap accounting exists, so swap is no way out (v1 gets
  the same from `memory.memsw.limit_in_bytes` = the memory limit);
- `pids.max` = `max_processes` (processes and threads);
- `cpu.max` = `"<quota> <period>"` with period 100000 us and quota `cpu_cores` x period
  (at least 1000 us, the kernel's minimum).

`enter_argv()` is the v1 prefix: a tiny `/bin/sh` writes its own pid (`$$`) into the
child's `cgroup.procs` and execs the command (exit 125, command not run, if it cannot).
`memory_limit_hits()` adds `oom_kill` and `max` from `memory.events`: `oom_kill` counts
processes the OOM killer killed in the cgroup, `max` counts the times usage reached
`memory.max` and the kernel had to reclaim or refuse; together they are the v1
`memory.oom_control` oom_kill + `memory.failcnt` sum, so both hierarchies name the
memory limit on the same events (like failcnt, `max` also counts a hit that reclaim
resolved, e.g. page cache pushed out at the limit). `pids_limit_hits()` is the `max`
line of `pids.events` (forks refused at `pids.max`). `kill()` writes 1 to `cgroup.kill`
(Linux 5.14+: the kernel kills every process in the cgroup, forks racing it included),
else SIGKILLs each pid in `cgroup.procs`, until the cgroup is empty; `remove()` kills and
then rmdirs the child.

Testing (tests/test_cgroups_v2.py): the limits, the controller delegation and the
events are tested only against a fake cgroupfs tree. No live cgroup v2 test of the
limits has run on gyre's own machines: they are cgroup v1 hosts, whose hybrid `unified`
cgroup2 mount has no memory, pids or cpu controller. Only the controller-free parts
(join via `enter_argv`, `kill` by `cgroup.kill` and by SIGKILL, `remove`) run live there.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.local.cgroups_base import CGROUP_ROOT, JOIN_SCRIPT, sigkill

log = logging.getLogger("gyre.sandboxes")
PARENT_ENV = "GYRE_CGROUP_V2_PARENT"
CONTROLLERS = ("cpu", "memory", "pids")
CPU_PERIOD_US = 100_000
_MIN_CPU_QUOTA_US = 1000
_PROC_SELF_CGROUP = Path("/proc/self/cgroup")
_REMOVE_RETRIES = 40
_REMOVE_WAIT_S = 0.05


@dataclass
class CgroupV2:
    """One command's cgroup in the unified hierarchy."""

    path: Path

    @classmethod
    def create(cls, limits: SandboxLimits, root: Path = CGROUP_ROOT) -> CgroupV2 | None:
        """A fresh child of the delegated parent with `limits` written; None (and a warning) if there is none."""
        parent = delegated_parent(root)
        if parent is None:
            return None
        group = cls(parent / f"gyre-{uuid.uuid4().hex[:12]}")
        try:
            _mkdir(group.path)
        except OSError as exc:
            log.warning("cgroup v2: cannot create a cgroup in %s (%s); no tree-wide limits", parent, exc)
            return None
        try:
            group._write("memory.max", str(limits.memory_bytes))
            if (group.path / "memory.swap.max").exists():  # absent without swap accounting: no swap to bound
                group._write("memory.swap.max", "0")
            group._write("pids.max", str(limits.max_processes))
            quota = max(_MIN_CPU_QUOTA_US, int(limits.cpu_cores * CPU_PERIOD_US))
            group._write("cpu.max", f"{quota} {CPU_PERIOD_US}")
        except OSError as exc:
            log.warning("cgroup v2: cannot write the limits of %s (%s); no tree-wide limits", group.path, exc)
            group.remove()
            return None
        return group

    def enter_argv(self) -> list[str]:
        """argv prefix: join this cgroup, then exec the rest of the command line."""
        return ["/bin/sh", "-c", JOIN_SCRIPT, "gyre-cgroup-enter", "1", str(self.path)]

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def memory_limit_hits(self) -> int:
        """OOM kills inside the cgroup plus times usage reached memory.max (0 if unknown); see the module docstring."""
        events = _events(self.path / "memory.events")
        return events.get("oom_kill", 0) + events.get("max", 0)

    def pids_limit_hits(self) -> int:
        """How often a fork failed at pids.max (0 if unknown)."""
        return _events(self.path / "pids.events").get("max", 0)

    def kill(self) -> None:
        """Kill every process in the cgroup until it is empty: `cgroup.kill` where present, else SIGKILL each pid."""
        for _ in range(_REMOVE_RETRIES):
            pids = self.pids()
            if not pids:
                return
            if not self._cgroup_kill():
                sigkill(pids)  # forks racing this loop are caught next round (pids.max bounds them)
            time.sleep(_REMOVE_WAIT_S)

    def remove(self) -> None:
        """Kill what is left, then delete the cgroup (it must be empty to go)."""
        self.kill()
        for _ in range(_REMOVE_RETRIES):
            try:
                _rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:  # EBUSY while the last killed processes are being reaped
                time.sleep(_REMOVE_WAIT_S)
        log.warning("cgroup v2: could not remove %s", self.path)

    def _cgroup_kill(self) -> bool:
        knob = self.path / "cgroup.kill"
        if not knob.exists():  # before Linux 5.14
            return False
        try:
            self._write("cgroup.kill", "1")
        except OSError:
            return False
        return True

    def _write(self, knob: str, value: str) -> None:
        _write(self.path / knob, value)


def delegated_parent(root: Path = CGROUP_ROOT) -> Path | None:
    """The cgroup command cgroups go under, with memory, pids and cpu enabled for its children; None if unusable.

    `$GYRE_CGROUP_V2_PARENT` if set, else gyre's own cgroup; see the module docstring.
    """
    if not (root / "cgroup.controllers").exists():
        log.debug("cgroup v2: no cgroup2 hierarchy mounted at %s", root)
        return None
    configured = os.environ.get(PARENT_ENV, "").strip()
    if configured:
        parent, source = _under(root, configured), f"${PARENT_ENV}"
    else:
        own = own_cgroup_v2()
        if own is None:
            log.warning("cgroup v2: no `0::` line in %s; no tree-wide limits", _PROC_SELF_CGROUP)
            return None
        parent, source = _under(root, own), "gyre's own cgroup"
    hint = f"set ${PARENT_ENV} to a delegated cgroup with no processes in it (see gyre.sandboxes.local.cgroups_v2)"
    try:
        available = set((parent / "cgroup.controllers").read_text().split())
    except OSError as exc:
        log.warning("cgroup v2: %s %s is not usable (%s); no tree-wide limits: %s", source, parent, exc, hint)
        return None
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        log.warning("cgroup v2: %s %s is not a delegated subtree: controller(s) %s not available to it "
                    "(its parent does not enable them); no tree-wide limits: %s",
                    source, parent, ", ".join(missing), hint)
        return None
    try:
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        to_enable = [c for c in CONTROLLERS if c not in enabled]
        if to_enable:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in to_enable))
    except OSError as exc:
        log.warning("cgroup v2: %s %s is not a delegated subtree: cannot enable %s in its cgroup.subtree_control "
                    "(%s); no tree-wide limits: %s", source, parent, ", ".join(CONTROLLERS), _why(exc), hint)
        return None
    return parent


def own_cgroup_v2() -> str | None:
    """This process's cgroup in the unified hierarchy (the `0::/path` line of /proc/self/cgroup), or None."""
    try:
        lines = _PROC_SELF_CGROUP.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:]
    return None


def _under(root: Path, cgroup: str) -> Path:
    """`cgroup` (a /proc/self/cgroup path, or a full path under `root`) as a directory of the hierarchy at `root`."""
    path = Path(cgroup)
    if path.is_relative_to(root):
        return path
    return root / cgroup.lstrip("/")


def _why(exc: OSError) -> str:
    reasons = {
        errno.EBUSY: "EBUSY: it has processes in it, and v2's no-internal-processes rule forbids enabling "
                     "controllers there",
        errno.EACCES: "EACCES: not delegated to this user",
        errno.EPERM: "EPERM: not delegated to this user",
        errno.EROFS: "EROFS: cgroupfs is mounted read-only, as in an unprivileged container",
        errno.ENOENT: "ENOENT: a controller is not available to it",
    }
    return reasons.get(exc.errno, str(exc))


def _events(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file (`memory.events`, `pids.events`) as {key: count}; {} if unreadable."""
    events: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return events
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            events[key] = int(value)
        except ValueError:
            continue
    return events


def _write(path: Path, value: str) -> None:
    """Write a cgroup interface file; never creates one (cgroupfs makes its own files, a missing one is an error)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _mkdir(path: Path) -> None:
    """Make a cgroup (cgroupfs fills it with its interface files; tests put a fake cgroupfs here)."""
    path.mkdir()


def _rmdir(path: Path) -> None:
    """Delete an empty cgroup (its interface files go with it; tests put a fake cgroupfs here)."""
    path.rmdir()
