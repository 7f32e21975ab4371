"""cgroups v1: limits on a command's whole process tree (processes, memory, CPU) and a sure kill.

rlimits bind one process at a time: a fork bomb, or a hundred processes of 100 MB each,
walks straight past them. A cgroup binds the tree. For each command the sandbox makes a
fresh cgroup under gyre's own cgroup in the `pids`, `memory` and `cpu` hierarchies
(nested under ours, so whatever limits the host put on gyre still hold), writes the
limits, and the command joins it before anything else runs: `enter_argv()` is a tiny
`/bin/sh` prefix that writes its own pid into each `cgroup.procs` and then execs the rest
(no Python between fork and exec, which is unsafe when the coordinator forks from many
threads). After the command, `kill()` SIGKILLs every pid left in the cgroup (they are all
processes this sandbox started) and `remove()` deletes the directories.

- `pids.max` = `SandboxLimits.max_processes` (tasks = processes and threads);
- `memory.limit_in_bytes` = `memory_bytes` (anonymous memory, page cache and tmpfs),
  and `memory.memsw.limit_in_bytes` the same where swap accounting exists, so swap is no
  way out; at the limit the kernel's OOM killer picks a process inside the cgroup;
- `cpu.cfs_quota_us` = `cpu_cores` x `cpu.cfs_period_us`.

`CgroupV1.create` returns None where cgroups v1 are not usable (no such hierarchy, a
cgroup v2-only host, no permission). cgroup v2 lives in `gyre.sandboxes.local.cgroups_v2`
(`CgroupV2`, same interface and limits); its "no internal processes" rule means it
needs a delegated parent cgroup (`$GYRE_CGROUP_V2_PARENT`, or gyre's own cgroup where
controllers can be enabled below it), see that module. `create_cgroup` is what callers
use: v1 where v1 works, else v2 where a delegated v2 parent is usable, else None, and
callers then fall back to rlimits and say so. Both return a `CommandCgroup`.

The v2 limits have been tested only against a fake cgroupfs tree (tests/test_cgroups_v2.py):
no live cgroup v2 test of them has run on gyre's own machines, which are cgroup v1 hosts
(only v2's controller-free join, kill and remove run live, on their hybrid `unified` mount).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.local.cgroups_base import CGROUP_ROOT, JOIN_SCRIPT, CommandCgroup, sigkill
from gyre.sandboxes.local.cgroups_v2 import CgroupV2

CONTROLLERS = ("pids", "memory", "cpu")
_REMOVE_RETRIES = 40
_REMOVE_WAIT_S = 0.05


def create_cgroup(limits: SandboxLimits, root: Path = CGROUP_ROOT) -> CommandCgroup | None:
    """A fresh cgroup for one command with `limits` written: v1 where it works, else v2, else None.

    `root` is where the hierarchies are mounted: the v1 controllers at `root/<controller>`,
    a cgroup v2-only host's unified hierarchy at `root` itself.
    """
    return CgroupV1.create(limits, root) or CgroupV2.create(limits, root)


@dataclass
class CgroupV1:
    """One command's cgroups, one directory per controller."""

    dirs: dict[str, Path]

    @classmethod
    def create(cls, limits: SandboxLimits, root: Path = CGROUP_ROOT) -> CgroupV1 | None:
        """Fresh cgroups with `limits` written; None if cgroups v1 with all three controllers are unusable."""
        own = own_cgroup_paths()
        name = f"gyre-{uuid.uuid4().hex[:12]}"
        dirs: dict[str, Path] = {}
        for controller in CONTROLLERS:
            hierarchy = root / controller
            if controller not in own or not (hierarchy / "cgroup.procs").exists():
                return None
            dirs[controller] = hierarchy / own[controller].lstrip("/") / name
        group = cls(dirs)
        try:
            for path in dirs.values():
                path.mkdir()
            group._write("pids", "pids.max", str(limits.max_processes))
            group._write("memory", "memory.limit_in_bytes", str(limits.memory_bytes))
            if (dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                group._write("memory", "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            period_us = int((dirs["cpu"] / "cpu.cfs_period_us").read_text())
            group._write("cpu", "cpu.cfs_quota_us", str(max(1000, int(limits.cpu_cores * period_us))))
        except OSError:
            group.remove()
            return None
        return group

    def enter_argv(self) -> list[str]:
        """argv prefix: join every cgroup of this group, then exec the rest of the command line."""
        return ["/bin/sh", "-c", JOIN_SCRIPT, "gyre-cgroup-enter", str(len(self.dirs)), *map(str, self.dirs.values())]

    def pids(self) -> list[int]:
        procs = self.dirs["pids"] / "cgroup.procs"
        try:
            return [int(line) for line in procs.read_text().split()]
        except FileNotFoundError:
            return []

    def memory_limit_hits(self) -> int:
        """OOM kills inside the cgroup plus allocations refused at the limit (0 if unknown)."""
        hits = 0
        try:
            hits += int((self.dirs["memory"] / "memory.failcnt").read_text())
            for line in (self.dirs["memory"] / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    hits += int(line.split()[1])
        except (FileNotFoundError, ValueError):
            pass
        return hits

    def pids_limit_hits(self) -> int:
        """How often a fork failed at pids.max (0 if unknown)."""
        try:
            return int((self.dirs["pids"] / "pids.events").read_text().split()[1])
        except (FileNotFoundError, ValueError, IndexError):
            return 0

    def kill(self) -> None:
        """SIGKILL every process in the cgroup until it is empty (forks racing the kill are caught next round)."""
        for _ in range(_REMOVE_RETRIES):
            pids = self.pids()
            if not pids:
                return
            sigkill(pids)
            time.sleep(_REMOVE_WAIT_S)

    def remove(self) -> None:
        """Kill what is left, then delete the cgroup directories (a cgroup must be empty to go)."""
        self.kill()
        for path in self.dirs.values():
            for _ in range(_REMOVE_RETRIES):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last killed processes are being reaped
                    time.sleep(_REMOVE_WAIT_S)

    def _write(self, controller: str, knob: str, value: str) -> None:
        (self.dirs[controller] / knob).write_text(value)


def own_cgroup_paths() -> dict[str, str]:
    """controller -> this process's cgroup path in that v1 hierarchy, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except FileNotFoundError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths
