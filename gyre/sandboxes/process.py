"""Run one shell command as its own process group: scrubbed env, rlimits, bounded output, timeout.

Both the agent's commands (`LocalSandbox.exec`) and the evaluator's hidden-test commands
run through `run_command`, so both get the same treatment:

- `bash -c command` in a new session (`start_new_session=True`), so the command and
  every child it forks, including background ones, share one process group that can be
  signalled as a whole.
- An environment built from scratch by `sandbox_env`: PATH, HOME, a UTF-8 locale,
  PYTHONDONTWRITEBYTECODE and what the caller passes explicitly (an execution's proxy
  URL and key). Nothing else of the host environment leaks in, so no host secrets.
  PATH starts with the directory of the interpreter running gyre, so `python` inside
  finds the same interpreter (and its pytest) whatever the host PATH says.
- rlimits from `SandboxLimits`, set by `prlimit` (util-linux) which then execs bash.
- Output read as it arrives, keeping only the head and tail of each stream.
- On timeout the whole group is signalled: SIGKILL at once, or, with
  `interrupt_grace_s > 0`, SIGINT first (pytest then still writes its report) and
  SIGKILL after the grace period. The output printed so far is returned.
- The call returns when the command's own bash exits. Background children that still
  hold the output pipes lose the output they write afterwards; they are killed with the
  group when `kill_leftovers` is set, else they keep running (the caller owns them).

Known gap: a child that calls setsid() leaves the group and escapes the kill; PID and
mount namespaces (bubblewrap backend) close that later.
"""

from __future__ import annotations

import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from gyre.sandboxes.base import ExecResult, SandboxLimits

FALLBACK_PATH = "/usr/local/bin:/usr/bin:/bin"
PRLIMIT = shutil.which("prlimit") or "/usr/bin/prlimit"
_POLL_S = 0.1
_DRAIN_IDLE_S = 0.05
_DRAIN_MAX_S = 1.0
_READ_CHUNK = 65536


def sandbox_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a sandboxed command: a fixed base plus `extra` (which wins)."""
    host_path = os.environ.get("PATH") or FALLBACK_PATH
    env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), host_path]),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    for key, value in (extra or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"sandbox env entries must be str -> str, got {key!r}: {value!r}")
        env[key] = value
    return env


class BoundedCapture:
    """Keeps the first and last `max_bytes // 2` bytes of a stream and counts the rest."""

    def __init__(self, max_bytes: int) -> None:
        self.head_limit = max_bytes - max_bytes // 2
        self.tail_limit = max_bytes // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total_bytes = 0

    def add(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        room = self.head_limit - len(self.head)
        self.head += chunk[:room]
        if self.tail_limit:
            self.tail += chunk[room:] if room > 0 else chunk
            del self.tail[: -self.tail_limit]

    def text(self) -> str:
        dropped = self.total_bytes - len(self.head) - len(self.tail)
        if dropped == 0:
            return (self.head + self.tail).decode("utf-8", errors="replace")
        marker = f"\n[... gyre: {dropped} bytes of output truncated ...]\n"
        return self.head.decode("utf-8", errors="replace") + marker + self.tail.decode("utf-8", errors="replace")


def run_command(
    command: str,
    *,
    cwd: Path,
    env: Mapping[str, str],
    limits: SandboxLimits,
    timeout_s: float,
    interrupt_grace_s: float = 0.0,
    kill_leftovers: bool = True,
    on_spawn: Callable[[int], None] | None = None,
) -> ExecResult:
    """Run `bash -c command` in `cwd` with exactly `env`; see the module docstring.

    `on_spawn(pgid)` is called once the process group exists (callers that keep
    background processes alive use it to kill them later).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    started = time.monotonic()
    proc = subprocess.Popen(
        [*_prlimit_argv(limits), "bash", "-c", command],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    if on_spawn is not None:
        on_spawn(proc.pid)
    stdout = BoundedCapture(limits.max_output_bytes)
    stderr = BoundedCapture(limits.max_output_bytes)
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, stdout)
        sel.register(proc.stderr, selectors.EVENT_READ, stderr)
        try:
            timed_out = _pump(proc, sel, started + timeout_s, interrupt_grace_s)
        finally:
            if kill_leftovers or proc.returncode is None:
                signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
    return ExecResult(
        exit_code=proc.returncode,
        stdout=stdout.text(),
        stderr=stderr.text(),
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to a process group; a group that is already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _pump(proc: subprocess.Popen, sel: selectors.BaseSelector, deadline: float, grace_s: float) -> bool:
    """Read output until the command's bash exits; signal the group at the deadline. True if it timed out."""
    timed_out = False
    kill_at: float | None = None
    while proc.poll() is None:
        now = time.monotonic()
        if not timed_out and now >= deadline:
            timed_out = True
            kill_at = now + grace_s
            if grace_s > 0:
                signal_group(proc.pid, signal.SIGINT)
        if kill_at is not None and now >= kill_at:
            signal_group(proc.pid, signal.SIGKILL)
            kill_at = float("inf")  # now only wait for it to die
        next_event = kill_at if kill_at is not None else deadline
        wait_s = min(_POLL_S, max(0.0, next_event - now))
        if sel.get_map():
            _read_ready(sel, wait_s)
        else:
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass
    # bash has exited: take what is already in the pipes, but do not wait for background writers.
    drain_until = time.monotonic() + _DRAIN_MAX_S
    while sel.get_map() and time.monotonic() < drain_until and _read_ready(sel, _DRAIN_IDLE_S):
        pass
    return timed_out


def _read_ready(sel: selectors.BaseSelector, wait_s: float) -> bool:
    """Read once from every ready pipe; False if nothing was ready within `wait_s`."""
    events = sel.select(wait_s)
    for key, _ in events:
        chunk = os.read(key.fd, _READ_CHUNK)
        if chunk:
            key.data.add(chunk)
        else:
            sel.unregister(key.fileobj)
    return bool(events)


def _prlimit_argv(limits: SandboxLimits) -> list[str]:
    """`prlimit` (util-linux) sets the rlimits and execs the command.

    Limits are applied by a program rather than a Python `preexec_fn`, because the
    coordinator forks from many threads at once and Python code between fork and exec is
    not safe there. Never asks above the host's hard limits.
    """
    argv = [PRLIMIT]
    for flag, res, soft, hard in (
        ("--cpu", resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1),
        ("--fsize", resource.RLIMIT_FSIZE, limits.max_file_bytes, limits.max_file_bytes),
        ("--as", resource.RLIMIT_AS, limits.address_space_bytes, limits.address_space_bytes),
        ("--nofile", resource.RLIMIT_NOFILE, limits.max_open_files, limits.max_open_files),
    ):
        _, host_hard = resource.getrlimit(res)
        if host_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, host_hard), min(hard, host_hard)
        argv.append(f"{flag}={soft}:{hard}")
    return argv
