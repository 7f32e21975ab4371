"""The local Ray a run starts (`gyre/cluster/ray_local.py`): loopback only, and gone with gyre.

A driver process (as `gyre run` would be) starts the head and one actor; the test reads
every listening socket of the head's session from /proc, then kills the driver with -9 and
waits for the whole session to go.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gyre.cluster.ray_local import session_pids as _session

DRIVER = """
import json, os, sys, time
from gyre.cluster.ray_local import loopback_environment, start_local_ray
loopback_environment()
local = start_local_ray(1)
import ray
ray.init(address=local.address, log_to_driver=False)

@ray.remote(num_cpus=0)
class Where:
    def ask(self):
        return os.getpid(), ray.util.get_node_ip_address()

actor = Where.remote()
pid, ip = ray.get(actor.ask.remote(), timeout=120)
print(json.dumps({"head_pid": local.process.pid, "address": local.address, "actor_pid": pid, "actor_ip": ip,
                  "node": ray.nodes()[0]["NodeManagerAddress"]}), flush=True)
time.sleep(600)
"""


def _listening(pids: list[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every listening TCP socket the processes hold."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                out.append((inodes[cols[9]], cols[1]))
    return out


def _loopback(hex_address: str) -> bool:
    host = hex_address.split(":")[0]
    if len(host) == 8:  # IPv4, little-endian: 127.x.x.x ends in 7F
        return host.endswith("7F")
    # IPv6: ::1 or ::ffff:127.x.x.x (v4-mapped), as /proc writes them (4 little-endian words)
    return host == "00000000000000000000000001000000" or (host[:16] == "0" * 16 and host[16:24] == "FFFF0000"
                                                          and host[30:32] == "7F")


@pytest.mark.slow
def test_the_local_ray_speaks_on_loopback_only_and_dies_with_a_killed_driver(tmp_path):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, start_new_session=True, cwd=Path(__file__).resolve().parents[1])
    try:
        line = driver.stdout.readline()  # the driver prints once Ray and the actor are up (or exits)
        assert line, f"the driver exited {driver.wait()} before Ray came up"
        info = json.loads(line)
        assert info["address"].startswith("127.0.0.1:")
        assert info["node"] == "127.0.0.1" and info["actor_ip"] == "127.0.0.1"
        head = info["head_pid"]
        ray_pids = _session(head)
        assert info["actor_pid"] in ray_pids and len(ray_pids) >= 3  # head CLI, GCS, raylet, ... the actor
        sockets = _listening(ray_pids)
        assert sockets, "Ray's processes hold no listening socket: the check would prove nothing"
        assert all(_loopback(address) for _, address in sockets), sockets
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's own group: kill -9, as a crash would
        driver.wait(timeout=30)
    deadline = time.monotonic() + 20  # the reaper kills the head's group at once; the actor dies with its raylet
    while _session(head) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _session(head) == [], "Ray processes outlived the killed driver"
