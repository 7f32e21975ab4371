"""What both cgroup versions share: where the hierarchies are mounted, how a command joins its
cgroup before anything else runs, the interface a command's cgroup offers, and a sure kill.

`gyre.sandboxes.local.cgroups` (v1, and `create_cgroup`, which picks a version) and
`gyre.sandboxes.local.cgroups_v2` both import this module; it imports neither.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Protocol, runtime_checkable

CGROUP_ROOT = Path("/sys/fs/cgroup")
JOIN_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit 125; shift; n=$((n-1)); done; '
    'exec "$@"'
)
"""`/bin/sh -c JOIN_SCRIPT gyre-cgroup-enter N DIR... CMD...`: write our pid into each of the N
cgroups, then exec the command (no Python between fork and exec)."""


@runtime_checkable
class CommandCgroup(Protocol):
    """One command's cgroup(s), whichever cgroup version made them."""

    def enter_argv(self) -> list[str]:
        """argv prefix that joins the cgroup(s), then execs the rest of the command line."""
        ...

    def pids(self) -> list[int]:
        """Processes in the cgroup now."""
        ...

    def memory_limit_hits(self) -> int:
        """Times the memory limit was hit (OOM kills plus allocations at the limit); 0 if unknown."""
        ...

    def pids_limit_hits(self) -> int:
        """Forks refused at the process limit; 0 if unknown."""
        ...

    def kill(self) -> None:
        """Kill every process in the cgroup until it is empty."""
        ...

    def remove(self) -> None:
        """Kill what is left, then delete the cgroup(s)."""
        ...


def sigkill(pids) -> None:
    """SIGKILL each pid; one already gone is fine."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
