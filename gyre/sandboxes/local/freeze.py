"""Every process of a sandbox session held still while gyre works on its workspace as root.

An in-place evaluation (Terminal-Bench, Harbor) must run the tests beside the processes the
agent left running, so it cannot kill them; it still has to give the evaluation's user access
to the workspace first (an ACL walk, as root). A process left running can swap a directory
for a symlink to a host file during that walk. `frozen(init_pid)` stops every process of the
session's PID namespace (the keeper's init and everything the agent's commands left behind)
with SIGSTOP, which no process can catch, ignore or block, in passes until one finds no process
still running (a fork in flight during a pass is caught by the next); after the block, SIGCONT.
The walk itself is fd-relative and never follows a link (`gyre.sandboxes.fdwalk`): the freeze
means nothing moves under it at all.

Membership is the PID namespace, read from `/proc/<pid>/ns/pid`: the session's processes can
make no namespace of their own (the seccomp filter denies it), so none hides in a child one.
A process that cannot be stopped within `STOP_WAIT_S` (it is being traced, or stuck in the
kernel) fails the freeze with an error naming it; the caller's work then does not run.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

FREEZE_PASSES = 20
"""Passes of stopping whatever still runs; a session that forks faster than this is refused."""
STOP_WAIT_S = 5.0
"""How long one process may take to reach the stopped state after SIGSTOP."""
_POLL_S = 0.005


def members(init_pid: int) -> set[int]:
    """Every process in the PID namespace whose init is `init_pid` (empty once it is gone)."""
    try:
        target = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return set()
    found = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") == target:
                    found.add(int(entry.name))
            except OSError:  # gone meanwhile
                continue
    return found


@contextmanager
def frozen(init_pid: int) -> Iterator[set[int]]:
    """Stop every process of `init_pid`'s PID namespace for the block (see the module docstring);
    yields the processes stopped."""
    stopped: set[int] = set()
    try:
        for _ in range(FREEZE_PASSES):
            running = members(init_pid) - stopped
            if not running:
                break
            for pid in running:
                _signal(pid, signal.SIGSTOP)
            for pid in running:
                _wait_stopped(pid)
            stopped |= running
        else:
            raise RuntimeError(f"the session of PID {init_pid} kept starting processes: not frozen")
        yield stopped
    finally:
        for pid in stopped:
            _signal(pid, signal.SIGCONT)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # exited meanwhile: nothing to stop or continue
        pass


def _wait_stopped(pid: int) -> None:
    """Until `pid` is stopped (state T) or gone; RuntimeError past `STOP_WAIT_S`."""
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in (b"T", b"t", b"Z", b"X"):
            return
        time.sleep(_POLL_S)
    raise RuntimeError(f"process {pid} of a sandbox session did not stop within {STOP_WAIT_S:g} s")
