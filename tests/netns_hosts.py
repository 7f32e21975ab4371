"""Hosts for multi-host tests on one box: Linux network namespaces joined by a bridge.

`Hosts.create(n)` makes one "head" namespace holding a bridge and `n` "worker" namespaces,
each joined to the bridge by a veth pair, all on a private /24 of their own (10.213.77.0/24 by
default: no address is ever added to the root namespace, and nothing outside these namespaces
is reached). Every namespace has `lo` up. Names carry the creating process's pid so runs do not
collide; interfaces are made directly inside their namespaces (`ip link add ... netns ...`).

Processes are started inside a namespace with `Hosts.spawn` (`ip netns exec`), each in a
session of its own and tracked by pid; `Hosts.close` kills exactly those process groups and
deletes the namespaces (which removes every interface in them). Root only.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

IP = shutil.which("ip") or "/sbin/ip"
SUBNET = "10.213.77"
"""A /24 unlikely to collide with anything real; every address here lives in the test's namespaces."""
KILL_WAIT_S = 30.0


class NetnsUnsupported(RuntimeError):
    """Network namespaces cannot be made here (not root, no `ip`, no kernel support): tests skip."""


def _ip(*args: str, timeout: float = 30.0) -> None:
    done = subprocess.run([IP, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")


def unsupported_reason() -> str | None:
    """Why namespaces cannot be used here, or None when they can (tries one and deletes it)."""
    if os.geteuid() != 0:
        return "needs root (creates network namespaces)"
    if not Path(IP).exists():
        return "needs iproute2's `ip`"
    probe = f"gyre-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _ip("-n", probe, "link", "add", "gyprobea", "type", "veth", "peer", "name", "gyprobeb")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a veth pair in a network namespace: {exc}"
    finally:
        try:
            _ip("netns", "del", probe)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            pass
    return None


@dataclass
class Hosts:
    """A head namespace (with the bridge) and worker namespaces, and the processes started in them."""

    tag: str
    head: str
    workers: list[str]
    head_ip: str
    worker_ips: list[str]
    worker_links: list[str]
    """Per worker: the head-side end of its veth (a bridge port), in the head namespace."""
    procs: list[subprocess.Popen] = field(default_factory=list)
    made: list[str] = field(default_factory=list)
    temp_dirs: list[Path] = field(default_factory=list)
    """Short per-host directories (Ray's socket paths must fit 107 bytes); removed by `close`."""

    @classmethod
    def create(cls, n_workers: int, tag: str | None = None) -> "Hosts":
        tag = tag or str(os.getpid())
        head = f"gyre-{tag}-head"
        workers = [f"gyre-{tag}-w{i}" for i in range(1, n_workers + 1)]
        bridge = f"gyb{tag}"[:15]
        hosts = cls(tag, head, workers, f"{SUBNET}.1", [f"{SUBNET}.{i + 1}" for i in range(1, n_workers + 1)],
                    [f"gyh{tag}w{i}"[:15] for i in range(1, n_workers + 1)],
                    temp_dirs=[Path(f"/tmp/gyr-{tag}-{n}") for n in ("h", *(f"w{i}" for i in range(1, n_workers + 1)))])
        try:
            for ns in (head, *workers):
                _ip("netns", "add", ns)
                hosts.made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", head, "link", "add", bridge, "type", "bridge")
            _ip("-n", head, "addr", "add", f"{hosts.head_ip}/24", "dev", bridge)
            _ip("-n", head, "link", "set", bridge, "up")
            for ns, ip, link in zip(workers, hosts.worker_ips, hosts.worker_links):
                peer = "eth0"  # its name inside the worker namespace (names are per namespace)
                _ip("-n", head, "link", "add", link, "type", "veth", "peer", "name", peer, "netns", ns)
                _ip("-n", head, "link", "set", link, "master", bridge)
                _ip("-n", head, "link", "set", link, "up")
                _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", peer)
                _ip("-n", ns, "link", "set", peer, "up")
        except BaseException:
            hosts.close()
            raise
        return hosts

    def spawn(self, ns: str, argv: list[str], *, env: dict[str, str], log: Path, cwd: Path | None = None
              ) -> subprocess.Popen:
        """`argv` inside namespace `ns`, in a session of its own, output to `log`; tracked for `close`."""
        with open(log, "ab") as out:
            proc = subprocess.Popen([IP, "netns", "exec", ns, *argv], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
        self.procs.append(proc)
        return proc

    def link(self, worker: int, up: bool) -> None:
        """Cut (`up=False`) or restore worker `worker`'s (1-based) link to the bridge."""
        _ip("-n", self.head, "link", "set", self.worker_links[worker - 1], "up" if up else "down")

    def session_pids(self) -> list[int]:
        """Live processes of the sessions this started (each spawned process leads its own)."""
        from gyre.cluster.ray_local import session_pids

        return sorted({pid for proc in self.procs for pid in session_pids(proc.pid)})

    def close(self) -> None:
        """Kill every process group started here (and whatever is left of their sessions), then
        delete the namespaces. Safe to call twice."""
        from gyre.cluster.ray_local import session_pids

        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline:
            left = False
            for proc in self.procs:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                for pid in session_pids(proc.pid):  # a member that moved to a group of its own
                    left = True
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if proc.poll() is None:
                    left = True
            if not left:
                break
            time.sleep(0.1)
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for ns in reversed(self.made):
            try:
                _ip("netns", "del", ns)
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                pass
        self.made.clear()
        for path in self.temp_dirs:
            shutil.rmtree(path, ignore_errors=True)
