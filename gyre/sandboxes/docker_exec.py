"""A command in a running container, bounded: `docker exec` has no timeout and no disk limit of its own.

`DockerSandbox` runs every agent and evaluation command through `bounded_exec`: `exec_run` in a thread,
watched against the deadline and the workspace's disk and file-count limits (the workspace is a bind mount
on the host's disk), and past either, the caller's stop steps in order (kill the command's processes by
their token, `kill_execs`; or signal every process of the evaluation's user, `signal_user`), each given its
seconds to work. A command that outlives them all has its container killed: the caller's sandbox is then
closed (the workspace is kept). Output is kept up to the limit (`BoundedCapture`).

Why tokens: an agent command's processes carry `GYRE_EXEC=<token>` in their environment, unique per command,
so a timed-out command's processes (and only those: background processes of commands that finished are left
alone, as in the local sandbox) are found by reading `/proc/*/environ` inside the container (`KILL_EXECS`).
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gyre.sandboxes.base import ExecResult, SandboxLimits
from gyre.sandboxes.docker_container import engine_call
from gyre.sandboxes.local.diskwatch import DEFAULT_INTERVAL_S, DiskWatch
from gyre.sandboxes.process import BoundedCapture

EXEC_ENV = "GYRE_EXEC"
"""The environment variable carrying an agent command's token."""
DISK_CHECK_S = DEFAULT_INTERVAL_S
"""How often a running command's workspace is measured against the disk and file-count limits (a walk of it;
the local sandbox's interval): what a command writes past the limit is bounded by its write rate times this."""
KILL_EXECS = r"""
for pass in 1 2 3; do
  found=
  for f in /proc/[0-9]*/environ; do
    p=${f#/proc/}; p=${p%/environ}
    [ "$p" = "$$" ] && continue
    while IFS= read -r -d '' v; do
      for t in "$@"; do
        if [ "$v" = "GYRE_EXEC=$t" ]; then kill -s KILL "$p" 2>/dev/null; found=1; fi
      done
    done 2>/dev/null < "$f"
  done
  [ -z "$found" ] && break
  sleep 0.1
done
true
"""
"""Kill every process whose environment holds GYRE_EXEC=<one of the arguments> (bash only)."""


def bounded_exec(container, argv: list[str], kwargs: dict[str, Any], timeout_s: float,
                 stops: list[tuple[Callable[[], None], float]], workspace: Path, limits: SandboxLimits,
                 max_output_bytes: int | None = None) -> tuple[ExecResult, bool]:
    """`container.exec_run(argv, **kwargs)` in a thread; past `timeout_s`, or once `workspace` holds more than
    `limits` allow (`limit_hit`: the disk and file-count watch, every `DISK_CHECK_S`), each stop step runs, then
    waits its seconds. (the result, False) when the command outlived them all: the container was killed."""
    started = time.monotonic()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = engine_call(container.exec_run, argv, demux=True, **kwargs)
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    watch = DiskWatch([workspace], limits.max_workspace_bytes, limits.max_workspace_files, interval_s=DISK_CHECK_S)
    deadline, limit_hit = started + timeout_s, None
    while worker.is_alive() and limit_hit is None and (left := deadline - time.monotonic()) > 0:
        worker.join(min(DISK_CHECK_S, left))
        limit_hit = watch() if worker.is_alive() else None
    timed_out = worker.is_alive() and limit_hit is None
    for stop, wait_s in stops if worker.is_alive() else ():
        stop()
        worker.join(wait_s)
        if not worker.is_alive():
            break
    if worker.is_alive():
        container.kill()
        return ExecResult(-9, "", "", timed_out, time.monotonic() - started, limit_hit), False
    if "error" in outcome:
        raise outcome["error"]
    result = outcome["result"]
    out, err = (BoundedCapture(max_output_bytes or limits.max_output_bytes) for _ in range(2))
    stdout, stderr = result.output if result.output is not None else (None, None)
    out.add(stdout or b"")
    err.add(stderr or b"")
    return ExecResult(result.exit_code if result.exit_code is not None else -1, out.text(), err.text(),
                      timed_out, time.monotonic() - started, limit_hit), True


def kill_execs(container, tokens: Sequence[str]) -> None:
    """Kill the processes of the agent commands holding `tokens` (`KILL_EXECS`)."""
    engine_call(container.exec_run, ["bash", "-c", KILL_EXECS, "gyre-kill", *tokens], demux=True)


def signal_user(container, user: str, signal_name: str) -> None:
    """Signal every process `user` may signal (its own: the container's processes have no capabilities)."""
    engine_call(container.exec_run, ["bash", "-c", f"kill -s {shlex.quote(signal_name)} -1 2>/dev/null; true"],
                user=user, demux=True)
