"""Process groups of sandbox commands die with gyre, even after a kill -9 of gyre.

Bubblewrap sandboxes end with gyre through `--die-with-parent`. A plain-process command
(no bubblewrap on the host) is its own process group in its own session, so nothing
ends it when gyre dies: after a kill -9 of `gyre run`, an agent's `sleep 600 &` or a hung
test would run on. A parent-death signal does not help here: the kernel delivers it when
the *thread* that forked exits (commands are forked from short-lived worker threads), and
it reaches only the direct child, not the command's own children.

So one small watcher process per gyre process holds the set of live command groups, told
by lines on a pipe (`+pgid` when a group starts, `-pgid` once gyre has killed it). The
pipe's write end lives only in gyre (non-inheritable; gyre's helper processes are spawned,
never forked), so when gyre ends by any means the watcher reads end-of-file and SIGKILLs
every group still listed. A group is forgotten once gyre has killed it, so a recycled
process-group id is never signalled. The watcher sits in its own session, out of reach of
the group kills.
"""

from __future__ import annotations

import subprocess
import sys
import threading

WATCHER = (
    "import os, signal, sys\n"
    "groups = set()\n"
    "for line in sys.stdin:\n"  # end-of-file: the gyre process is gone
    "    op, pgid = line[0], int(line[1:])\n"
    "    groups.add(pgid) if op == '+' else groups.discard(pgid)\n"
    "for pgid in groups:\n"
    "    try:\n"
    "        os.killpg(pgid, signal.SIGKILL)\n"
    "    except (ProcessLookupError, PermissionError):\n"
    "        pass\n"
)

_lock = threading.Lock()
_watcher: subprocess.Popen | None = None


def _send(line: str) -> None:
    global _watcher
    with _lock:
        if _watcher is None or _watcher.poll() is not None:
            _watcher = subprocess.Popen([sys.executable, "-S", "-c", WATCHER], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True, text=True)
        _watcher.stdin.write(line + "\n")
        _watcher.stdin.flush()


def watch(pgid: int) -> None:
    """Kill process group `pgid` if this process ends before `forget(pgid)`."""
    _send(f"+{pgid}")


def forget(pgid: int) -> None:
    """Group `pgid` has been killed (or is gone): never signal that id again."""
    _send(f"-{pgid}")


def watcher_pid() -> int | None:
    """The watcher's pid, for tests (None before the first command)."""
    with _lock:
        return None if _watcher is None else _watcher.pid
