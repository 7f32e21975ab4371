"""The docker sandbox against a real engine: what its container promises, checked where it runs.

`make test` and CI start the engine (`scripts/docker-engine.sh run`: a private dockerd and a Debian base
image built offline); without it these tests skip and say why, and under `GYRE_REQUIRE_DOCKER=1` (the
script found an engine) a skip is a failure (`tests/conftest.py`). The SDK fake of `tests/docker_fake.py`
checks the calls; these check what the engine does with them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import gyre.sandboxes.docker as docker_sandbox
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.docker import DockerSandbox
from gyre.sandboxes.docker_container import cgroup_parent, evaluation_user
from tests.test_sandbox_docker import _query


def _box(tmp_path: Path, image: str, **kwargs) -> DockerSandbox:
    return DockerSandbox.create(_query(tmp_path), tmp_path / "ws", image=image, **kwargs)


def test_only_the_workspace_and_tmp_are_writable(tmp_path, docker_image):
    box = _box(tmp_path, docker_image)
    try:
        root = box.exec("touch /usr/gyre-x", timeout_s=30)
        assert root.exit_code != 0 and "Read-only file system" in root.stderr
        assert box.exec("touch /app/made /tmp/made && cat a.py", timeout_s=30).stdout == "x = 1\n"
        assert (box.workspace / "made").exists()
        # no capabilities: the image's root cannot mount, change owners or reach the network
        assert box.exec("chown 1:1 /app/made", timeout_s=30).exit_code != 0
        assert box.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1", timeout_s=30).stdout.split() == ["lo"]
    finally:
        box.destroy()


def test_evaluation_slots_are_closed_to_the_agent_and_open_to_a_uid_with_no_passwd_entry(tmp_path, docker_image):
    uid, gid = evaluation_user()
    box = _box(tmp_path, docker_image, eval_slots={"tests": "/gyre/tests", "results": "/gyre/results"})
    try:
        (box.slot("tests") / "test_x.py").write_text("def test_x():\n    assert True\n")
        os.chown(box.slot("tests") / "test_x.py", uid, gid)
        # the agent (the image's root, without capabilities) can neither list nor open them
        listed = box.exec("ls /gyre/tests", timeout_s=30)
        assert listed.exit_code != 0 and "Permission denied" in listed.stderr
        assert box.exec("cat /gyre/tests/test_x.py", timeout_s=30).exit_code != 0
        # the evaluation's user, unknown to the image's /etc/passwd, reads the tests (read-only) and writes results
        user = f"{uid}:{gid}"
        who = box.run_as("id -u; getent passwd $(id -u) || echo no-entry; cat /gyre/tests/test_x.py | head -1; "
                         "touch /gyre/tests/y 2>&1 | grep -c 'Read-only'; echo ok > /gyre/results/r",
                         user=user, env={}, timeout_s=60)
        assert who.stdout.split("\n")[:4] == [str(uid), "no-entry", "def test_x():", "1"], who
        assert (box.slot("results") / "r").read_text() == "ok\n"
    finally:
        box.destroy()


def test_a_timed_out_command_loses_only_its_own_processes(tmp_path, docker_image):
    box = _box(tmp_path, docker_image)
    try:
        box.exec("(sleep 300 > /dev/null 2>&1 &)", timeout_s=30)  # a server the agent left running
        started = time.monotonic()
        slow = box.exec("sleep 200", timeout_s=1)
        assert slow.timed_out and time.monotonic() - started < docker_sandbox.STOP_WAIT_S
        left = box.exec("ps -eo args", timeout_s=30).stdout
        assert "sleep 300" in left and "sleep 200" not in left
    finally:
        box.destroy()


def test_a_command_filling_the_workspace_is_stopped_with_the_reason(tmp_path, docker_image):
    """The workspace is a bind mount on the host's disk (the container's own root is read-only, its /tmp a
    capped tmpfs): a command writing past `max_workspace_bytes` is stopped, says why, and the sandbox goes on."""
    box = _box(tmp_path, docker_image, limits=SandboxLimits(max_workspace_bytes=8 << 20))
    try:
        started = time.monotonic()
        filling = box.exec("while :; do head -c 1048576 /dev/zero >> fill.bin; done", timeout_s=60)
        assert filling.limit_hit and "disk limit" in filling.limit_hit and not filling.timed_out, filling
        assert time.monotonic() - started < 30
        assert (box.workspace / "fill.bin").stat().st_size < 1 << 30  # the write rate x the check interval past it
        assert box.exec("rm fill.bin && echo ok", timeout_s=30).stdout == "ok\n"
    finally:
        box.destroy()


def test_a_fork_storm_past_its_timeout_leaves_nothing_running(tmp_path, docker_image, monkeypatch):
    """A command filling `pids_limit` times out and nothing of it survives: its kill (an exec) reaps it, with
    docker's init as PID 1 reaping the orphans (under `sleep infinity` their zombies held the limit, and
    every later exec failed to start); where even the kill cannot start (runc's exit 126 near the limit),
    the container itself is killed and the sandbox closes."""
    monkeypatch.setattr(docker_sandbox, "STOP_WAIT_S", 3.0)
    box = _box(tmp_path, docker_image, limits=SandboxLimits(max_processes=16))
    try:
        started = time.monotonic()
        storm = box.exec("(while :; do sleep 300 & done) & while :; do sleep 301 & done", timeout_s=3)
        assert storm.timed_out and time.monotonic() - started < 3 + 2 * docker_sandbox.STOP_WAIT_S + 5
        if box.closed:  # the kill could not start
            box.container.reload()
            assert box.container.status != "running"
        else:
            left = box.exec("ps -eo stat,args", timeout_s=30)
            assert left.exit_code == 0, left
            assert "sleep 30" not in left.stdout, left.stdout
            assert not [line for line in left.stdout.splitlines() if line.startswith("Z")], left.stdout  # no zombie
            assert box.exec("echo fine", timeout_s=30).stdout == "fine\n"  # the pids are free again
    finally:
        box.destroy()
    assert not box.workspace.exists()


def test_a_containers_memory_is_charged_under_gyres_cgroup(tmp_path, docker_image):
    limit = 256 << 20
    box = _box(tmp_path, docker_image, limits=SandboxLimits(memory_bytes=limit), cgroup_parent_name="gyre-docker")
    try:
        parent = cgroup_parent("gyre-docker")
        v1 = Path("/sys/fs/cgroup/memory") / parent.lstrip("/") / box.container.id / "memory.limit_in_bytes"
        v2 = Path("/sys/fs/cgroup") / parent.lstrip("/") / box.container.id / "memory.max"
        found = v1 if v1.exists() else v2
        assert found.exists(), f"no cgroup of the container under {parent}"
        assert int(found.read_text()) == limit
        # what the container allocates is counted there
        box.exec("python3 -c \"b = bytearray(64 << 20); import time; time.sleep(3)\" &", timeout_s=30)
        usage = found.with_name("memory.usage_in_bytes" if found == v1 else "memory.current")
        deadline = time.monotonic() + 20
        while int(usage.read_text()) < 48 << 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert int(usage.read_text()) >= 48 << 20
    finally:
        box.destroy()


def test_an_image_that_is_not_here_is_a_clear_error_and_leaves_no_slots(tmp_path, docker_image):
    from gyre.sandboxes.base import SandboxStartError

    with pytest.raises(SandboxStartError, match="gyre-no-such-image:0 is not on this engine and is not pulled"):
        _box(tmp_path, "gyre-no-such-image:0", eval_slots={"tests": "/gyre/tests"})
    assert not list(tmp_path.glob(".ws*"))  # the slot directories went with the failed start


def test_bench_sandbox_measures_a_container_against_the_local_sandbox(docker_image):
    import json

    from typer.testing import CliRunner

    from gyre.cli.main import app

    result = CliRunner().invoke(app, ["bench", "sandbox", "--rounds", "2", "--image", docker_image, "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert [row["backend"] for row in figures["rows"]] == ["local", "docker"] and figures["skipped"] == {}
    docker = figures["rows"][1]
    assert all(docker[phase] > 0 for phase in ("create", "exec_true", "exec_python", "write_read", "close"))
    assert docker["x_local"]["total"] == pytest.approx(docker["total"] / figures["rows"][0]["total"])
