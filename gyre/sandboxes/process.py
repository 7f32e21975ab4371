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
- Standard input is empty, or the bytes the caller passes (`stdin`, written from a thread
  while the output is read, so a command that writes before it has read all never blocks us).
- Output read as it arrives, keeping only the head and tail of each stream.
- On timeout the whole group is signalled: SIGKILL at once, or, with
  `interrupt_grace_s > 0`, SIGINT first (pytest then still writes its report) and
  SIGKILL after the grace period. The output printed so far is returned.
- The call returns when the command's own bash exits. Background children that still
  hold the output pipes lose the output they write afterwards; they are killed with the
  group when `kill_leftovers` is set, else they keep running (the caller owns them).

Isolation is layered around this by the caller (`gyre.sandboxes.local.isolation`): `enter`
is argv run before the rlimits (joining a cgroup), `confine` is argv run after them and
before bash (bubblewrap). `watch` is polled while the command runs; when it returns a
reason the group is killed and the reason lands in `ExecResult.limit_hit`.

Every command's group is watched by `gyre.sandboxes.reaper` until gyre has killed it, so
it dies with gyre even after a kill -9 of gyre. Known gap without bubblewrap: a child that
calls setsid() leaves the group and escapes the kill. With it, the PID namespace dies with
the command.
"""

from __future__ import annotations

import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gyre.sandboxes import reaper
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
    enter: Sequence[str] = (),
    confine: Sequence[str] = (),
    watch: Callable[[], str | None] | None = None,
    nproc_rlimit: bool = False,
    interrupt_descendants_only: bool = False,
    pass_fds: Sequence[int] = (),
    stdin: bytes | None = None,
) -> ExecResult:
    """Run `bash -c command` in `cwd` with exactly `env`; see the module docstring.

    `on_spawn(pgid)` is called once the process group exists (callers that keep
    background processes alive use it to kill them later). RLIMIT_NPROC is set only with
    `nproc_rlimit=True`: it counts every process of the host user, not only this command's.
    `interrupt_descendants_only`: the timeout's SIGINT skips the spawned process itself
    (bubblewrap's monitor would die of it and take the command down before pytest writes
    its report) and goes to every process below it. `pass_fds` stay open in the command.
    `stdin`: the command's standard input (None: empty).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    started = time.monotonic()
    proc = subprocess.Popen(
        [*enter, *_prlimit_argv(limits, nproc_rlimit), *confine, "bash", "-c", command],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )
    reaper.watch(proc.pid)  # killed with gyre, whatever ends gyre
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), name="gyre-stdin", daemon=True).start()
    if on_spawn is not None:
        on_spawn(proc.pid)
    interrupt = _signal_descendants if interrupt_descendants_only else signal_group
    return _until_done(proc, started, timeout_s, limits, interrupt_grace_s, watch, interrupt, kill_leftovers)


def _until_done(proc: subprocess.Popen, started: float, timeout_s: float, limits: SandboxLimits,
                interrupt_grace_s: float, watch: Callable[[], str | None] | None, interrupt,
                kill_leftovers: bool) -> ExecResult:
    """Capture the command's output (bounded) until it exits, times out or hits a limit; then kill
    its group (with `kill_leftovers`, or when it is still running) and reap it."""
    stdout = BoundedCapture(limits.max_output_bytes)
    stderr = BoundedCapture(limits.max_output_bytes)
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, stdout)
        sel.register(proc.stderr, selectors.EVENT_READ, stderr)
        try:
            timed_out, limit_hit = _pump(proc, sel, started + timeout_s, interrupt_grace_s, watch, interrupt)
        finally:
            if kill_leftovers or proc.returncode is None:
                signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            if kill_leftovers:
                reaper.forget(proc.pid)  # else the caller owns what is left: it calls `kill_group`
            proc.stdout.close()
            proc.stderr.close()
    return ExecResult(exit_code=proc.returncode, stdout=stdout.text(), stderr=stderr.text(), timed_out=timed_out,
                      duration_s=time.monotonic() - started, limit_hit=limit_hit)


def _feed(pipe, data: bytes) -> None:
    """Write `data` to a command's standard input and close it; a command that stopped reading
    (it exited, or was killed) just does not get the rest."""
    try:
        pipe.write(data)
    except (BrokenPipeError, ValueError):  # deliberate: the command is gone or closed its input
        pass
    finally:
        try:
            pipe.close()
        except (BrokenPipeError, ValueError):  # deliberate: as above
            pass


def kill_group(pgid: int) -> None:
    """SIGKILL a command's process group that its caller kept alive, and forget it (`reaper`)."""
    signal_group(pgid, signal.SIGKILL)
    reaper.forget(pgid)


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to a process group; a group that is already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _signal_descendants(pid: int, sig: int) -> None:
    """Send `sig` to every descendant of `pid` (not `pid` itself), found through /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        stack += children.get(child, [])
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass


def _pump(
    proc: subprocess.Popen,
    sel: selectors.BaseSelector,
    deadline: float,
    grace_s: float,
    watch: Callable[[], str | None] | None,
    interrupt: Callable[[int, int], None],
) -> tuple[bool, str | None]:
    """Read output until the command's bash exits; signal the group at the deadline.

    Returns (timed out, the limit `watch` reported or None).
    """
    timed_out = False
    limit_hit: str | None = None
    kill_at: float | None = None
    while proc.poll() is None:
        now = time.monotonic()
        if limit_hit is None and watch is not None:
            limit_hit = watch()
            if limit_hit is not None:
                signal_group(proc.pid, signal.SIGKILL)
                kill_at = float("inf")
        if not timed_out and now >= deadline:
            timed_out = True
            kill_at = now + grace_s
            if grace_s > 0:
                interrupt(proc.pid, signal.SIGINT)
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
    return timed_out, limit_hit


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


def _prlimit_argv(limits: SandboxLimits, nproc_rlimit: bool) -> list[str]:
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
        *([("--nproc", resource.RLIMIT_NPROC, limits.max_processes, limits.max_processes)] if nproc_rlimit else []),
    ):
        _, host_hard = resource.getrlimit(res)
        if host_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, host_hard), min(hard, host_hard)
        argv.append(f"{flag}={soft}:{hard}")
    return argv
