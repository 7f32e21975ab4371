"""A plain-process sandbox command (no bubblewrap) dies with gyre, even after a kill -9 of gyre;
a group gyre has killed itself is forgotten, so a recycled id is never signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GONE_S = 20.0
"""Bound on the watcher noticing the kill and killing the group, at load 10."""
STARTED_S = 120.0

GYRE_LIKE = """
import sys, threading
from pathlib import Path
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.process import run_command, sandbox_env

def command():
    run_command("sleep 300 & exec sleep 300", cwd=Path(sys.argv[1]), env=sandbox_env(Path(sys.argv[1])),
                limits=SandboxLimits(), timeout_s=600, on_spawn=lambda pgid: print(pgid, flush=True))

thread = threading.Thread(target=command)  # forked from a worker thread, as the coordinator does
thread.start()
thread.join()
"""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    for entry in Path("/proc").iterdir():  # zombies of the group count as gone
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def test_a_plain_process_command_dies_with_a_kill9_of_its_gyre(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", GYRE_LIKE, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    pgid = None
    try:
        pgid = int(proc.stdout.readline())
        deadline = time.monotonic() + STARTED_S
        while time.monotonic() < deadline and not _group_alive(pgid):
            time.sleep(0.05)
        assert _group_alive(pgid)
        proc.kill()
        proc.wait(timeout=60)
        deadline = time.monotonic() + GONE_S
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.1)
        assert not _group_alive(pgid), "the command's group outlived its gyre"
    finally:
        proc.kill()
        if pgid is not None and _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)


def test_the_watcher_kills_only_groups_still_listed_when_gyre_ends():
    """`-pgid` (gyre killed that group itself) takes a group off the list: at end-of-file the
    watcher kills the listed group and leaves the forgotten one (its id may be recycled) alone."""
    from gyre.sandboxes.reaper import WATCHER

    forgotten = subprocess.Popen(["sleep", "300"], start_new_session=True)
    listed = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        watcher = subprocess.Popen([sys.executable, "-S", "-c", WATCHER], stdin=subprocess.PIPE, text=True,
                                   start_new_session=True)
        watcher.communicate(f"+{forgotten.pid}\n+{listed.pid}\n-{forgotten.pid}\n", timeout=60)
        assert watcher.returncode == 0
        assert listed.wait(timeout=GONE_S) == -signal.SIGKILL
        assert forgotten.poll() is None
    finally:
        forgotten.kill()
        listed.kill()
        forgotten.wait()
        listed.wait()
