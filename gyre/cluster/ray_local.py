"""A local Ray for a run: started by gyre, on loopback only, gone within seconds of gyre.

Cells become Ray actors (one process each, restartable, placeable on other hosts); on a
cluster the run joins an existing Ray (`ray.address`), and on one box gyre starts its own,
with no set-up. Two things Ray does by default are wrong for us, both seen on this box:

- It advertises and listens on the machine's non-loopback address, even with
  `--node-ip-address=127.0.0.1` (it asks the OS for the route to a public resolver and
  replaces a loopback address with that one). With `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` in
  the environment of every Ray process (read when `ray` is imported), Ray takes 127.0.0.1 as
  the node address and binds its GCS, raylet, object manager and workers to loopback: the
  single-machine mode it uses on macOS and Windows. `LOOPBACK_ENV` is that setting.
- When the driver started Ray itself (`ray.init()` with no address) and is killed -9, the
  GCS and raylet notice within seconds, but the dashboard and runtime-env agents live on
  about a minute more. So gyre starts the head as `ray start --head --block` in a session
  of its own and hands its process group to the sandbox reaper (`gyre.sandboxes.reaper`):
  when gyre ends by any means, the whole group is killed at once; actor workers, which sit
  in groups of their own, die with their raylet.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gyre.sandboxes import reaper

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Ray's single-machine mode: node address 127.0.0.1, every Ray listener bound to loopback."""
QUIET_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
START_TIMEOUT_S = 120.0  # `ray start` takes 5-10 s on an idle 2-core box; a loaded one, several times that
STOP_TIMEOUT_S = 10.0


class RayStartError(RuntimeError):
    """The local Ray head did not come up; the message holds its output."""


@dataclass
class LocalRay:
    """A Ray head started by this process; `address` is what `ray.init(address=...)` takes."""

    address: str
    process: subprocess.Popen
    temp_dir: Path

    def stop(self) -> None:
        """Kill every process of the head's session (GCS, raylet, agents, and the actors' workers,
        which sit in groups of their own) and wait until they are gone."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=STOP_TIMEOUT_S)
        reaper.forget(self.process.pid)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while (left := session_pids(self.process.pid)) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`, read from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def loopback_environment() -> None:
    """Put Ray's loopback settings into this process's environment: call before `import ray`
    (Ray reads them at import) so the driver, too, speaks to Ray over 127.0.0.1 only."""
    if "ray" in sys.modules and os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0":
        raise RuntimeError("ray was imported before gyre set its loopback environment: the driver would "
                           "advertise the machine's address; import gyre.cluster.ray_local first")
    os.environ.update(LOOPBACK_ENV)
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)


def start_local_ray(num_cpus: int, ray_bin: Path | None = None) -> LocalRay:
    """Start a Ray head on 127.0.0.1 with `num_cpus` CPUs, watched by the reaper; wait until it answers."""
    ray_bin = ray_bin or Path(sys.executable).with_name("ray")
    port = _free_port()
    temp_dir = Path(tempfile.mkdtemp(prefix="gyre-ray-"))  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, **QUIET_ENV, **LOOPBACK_ENV}
    log = temp_dir / "ray-start.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(ray_bin), "start", "--head", "--block", f"--port={port}", f"--num-cpus={num_cpus}",
             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )  # fmt: skip
    reaper.watch(process.pid)  # its own session: its pgid is its pid
    local = LocalRay(f"127.0.0.1:{port}", process, temp_dir)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = log.read_text(errors="replace")[-4000:]
            local.stop()
            raise RayStartError(f"`ray start --head` exited {process.returncode}:\n{text}")
        if _listening(port):
            return local
        time.sleep(0.2)
    text = log.read_text(errors="replace")[-4000:]
    local.stop()
    raise RayStartError(f"`ray start --head` did not listen on 127.0.0.1:{port} within {START_TIMEOUT_S} s:\n{text}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
