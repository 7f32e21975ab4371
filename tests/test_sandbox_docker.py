"""DockerSandbox: container arguments and backend selection unit-tested (the docker SDK faked at
the edge), the preflight error without an engine checked for real; live tests only where a
Docker engine answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest
from pydantic import ValidationError

from gyre.config.run import RunConfig, SandboxConfig
from gyre.records import Query
from gyre.runtime.resolve import preflight
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.bridge import INSIDE_DIR as BRIDGE_INSIDE
from gyre.sandboxes.docker import NO_PYTHON3, DockerSandbox
from gyre.sandboxes.docker_exec import EXEC_ENV, KILL_EXECS
from gyre.sandboxes.docker_container import cgroup_parent, container_kwargs
from gyre.sandboxes.factory import SandboxBackendError, check_backend, create_sandbox
from gyre.sandboxes.local.isolation import Isolation
from gyre.sandboxes.local.sandbox import LocalSandbox
from tests.docker_fake import FakeContainer, fake_sdk


def test_container_arguments_isolate_and_limit(tmp_path):
    limits = SandboxLimits(max_processes=64, memory_bytes=512 << 20, cpu_cores=1.5, max_file_bytes=1 << 20)
    kwargs = container_kwargs("img:1", tmp_path / "ws", "/app", limits, {"OPENAI_API_KEY": "k"}, "gyre-x")
    assert kwargs["network_mode"] == "none"
    assert kwargs["pids_limit"] == 64 and kwargs["mem_limit"] == kwargs["memswap_limit"] == 512 << 20
    assert kwargs["nano_cpus"] == 1_500_000_000
    assert kwargs["cap_drop"] == ["ALL"] and "no-new-privileges" in kwargs["security_opt"]
    assert kwargs["read_only"] is True and "/tmp" in kwargs["tmpfs"]
    assert kwargs["volumes"] == {str(tmp_path / "ws"): {"bind": "/app", "mode": "rw"}}  # the only host mount
    assert kwargs["working_dir"] == "/app" and kwargs["environment"] == {"OPENAI_API_KEY": "k"}
    assert {"name": "fsize", "soft": 1 << 20, "hard": 1 << 20} in kwargs["ulimits"]
    assert kwargs["image"] == "img:1" and kwargs["detach"] is True


def test_live_container_runs_without_network(tmp_path, docker_image):
    from gyre.records import Query
    from gyre.sandboxes.docker import DockerSandbox

    (tmp_path / "h").mkdir()
    query = Query(query_id="q", benchmark="t", instruction="x", root=tmp_path, hidden_tests_dir=tmp_path / "h",
                  test_files=["a"], test_commands=["x"], test_case_count=1)
    sandbox = DockerSandbox.create(query, tmp_path / "ws", image=docker_image)
    try:
        result = sandbox.exec("echo hi > out.txt; cat /proc/net/dev | tail -n +3 | cut -d: -f1", timeout_s=30)
        assert result.stdout.split() == ["lo"]
        assert sandbox.read_file("out.txt") == "hi\n"
    finally:
        sandbox.destroy()


def _query(tmp_path) -> Query:
    (tmp_path / "hidden").mkdir()
    (tmp_path / "start").mkdir()
    (tmp_path / "start" / "a.py").write_text("x = 1\n")
    return Query(query_id="q", benchmark="t", instruction="x", root=tmp_path, start_dir=tmp_path / "start",
                 hidden_tests_dir=tmp_path / "hidden", test_files=["t.py"], test_commands=["pytest"],
                 test_case_count=1)


def test_sandbox_type_is_local_or_docker():
    assert SandboxConfig().type == "local"
    assert SandboxConfig(type="docker", image="img:2").image == "img:2"
    with pytest.raises(ValidationError):
        SandboxConfig(type="podman")


def test_preflight_stops_a_docker_run_when_no_engine_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    config = RunConfig.model_validate({"cache_dir": str(tmp_path / "cache"), "sandbox": {"type": "docker"}})
    with pytest.raises(SandboxBackendError, match="sandbox.type is 'docker' but .*sandbox.type: local"):
        preflight(config)
    assert not (tmp_path / "cache").exists()  # stopped before building the benchmark or the model
    assert isinstance(SandboxBackendError("x"), ValueError)  # `gyre run` prints it as an input error


def test_cli_harnesses_are_allowed_in_docker(monkeypatch):
    """A CLI harness in a container reaches the proxy through the bridge: only a missing engine stops it."""
    monkeypatch.setattr("gyre.sandboxes.docker_container.engine_problem", lambda: None)
    check_backend(SandboxConfig(type="docker"), "claude-code")
    check_backend(SandboxConfig(type="docker"), "mini-swe-agent")
    monkeypatch.setattr("gyre.sandboxes.docker_container.engine_problem", lambda: "no engine")
    with pytest.raises(SandboxBackendError, match="no engine"):
        check_backend(SandboxConfig(type="docker"), "claude-code")


def test_create_sandbox_starts_a_container_for_docker_and_a_local_sandbox_otherwise(tmp_path, monkeypatch):
    started: list[dict] = []

    sdk, _ = fake_sdk()  # its errors, images (every image present) and stopped containers (holding no files)

    class FakeContainers:
        create = staticmethod(sdk.from_env().containers.create)

        def run(self, **kwargs):
            started.append(kwargs)
            return types.SimpleNamespace(remove=lambda force: None)

    sdk.from_env = lambda **_: types.SimpleNamespace(containers=FakeContainers(), images=types.SimpleNamespace(
        get=lambda name: name), info=lambda: {"CgroupDriver": "cgroupfs"})
    monkeypatch.setitem(sys.modules, "docker", sdk)  # the SDK is the outer edge
    query, limits, isolation = _query(tmp_path), SandboxLimits(), Isolation.detect("none")
    env = {"OPENAI_API_KEY": "k"}

    docker_box = create_sandbox(SandboxConfig(type="docker", image="fallback:1"), query, tmp_path / "ws-d", env,
                                limits, isolation, image=None, workdir=None)
    assert isinstance(docker_box, DockerSandbox) and (docker_box.workspace / "a.py").exists()
    assert started[-1]["image"] == "fallback:1" and started[-1]["working_dir"] == "/app"
    create_sandbox(SandboxConfig(type="docker"), query, tmp_path / "ws-i", env, limits, isolation,
                   image="task-image:3", workdir="/work")
    assert started[-1]["image"] == "task-image:3" and started[-1]["working_dir"] == "/work"  # the query's own
    docker_box.close()
    # an image this machine cannot pull, replaced through `sandbox.docker.base_images` and recorded so
    mapped = SandboxConfig(type="docker", docker={"base_images": {"python:3.13-slim": "gyre-base:local"}})
    box = create_sandbox(mapped, query, tmp_path / "ws-m", env, limits, isolation, image="python:3.13-slim")
    assert started[-1]["image"] == "gyre-base:local" and box.image == "python:3.13-slim -> gyre-base:local"
    assert docker_box.image == "fallback:1"  # nothing replaced: the image itself
    # every container labelled, its cgroup under gyre's own memory cgroup
    assert started[-1]["labels"] == {"gyre": "1"}
    assert started[-1]["cgroup_parent"] == cgroup_parent("gyre-docker") and started[-1]["cgroup_parent"].endswith(
        "/gyre-docker")
    box.close()

    local_box = create_sandbox(SandboxConfig(), query, tmp_path / "ws-l", env, limits, isolation)
    assert isinstance(local_box, LocalSandbox) and len(started) == 3
    local_box.close()


# -- the route to the proxy, the agent's end, timeouts (SDK faked at its edge: tests/docker_fake.py) ------


def _fake_box(tmp_path, monkeypatch, handler=None) -> tuple[DockerSandbox, FakeContainer]:
    sdk, made = fake_sdk(handler)
    monkeypatch.setitem(sys.modules, "docker", sdk)
    box = DockerSandbox.create(_query(tmp_path), tmp_path / "ws", {"OPENAI_API_KEY": "k"})
    return box, made[-1]


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"proxy:" + conn.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def test_open_proxy_bridges_through_the_mounted_directory(tmp_path, monkeypatch):
    box, container = _fake_box(tmp_path, monkeypatch)
    bridge_dir = next(Path(h) for h, v in container.kwargs["volumes"].items() if v["bind"] == BRIDGE_INSIDE)
    assert container.kwargs["volumes"][str(bridge_dir)]["mode"] == "ro"
    assert container.kwargs["network_mode"] == "none"  # the route is the socket, not a network
    server, port = _echo_server()
    try:
        prefix = box.open_proxy(f"http://127.0.0.1:{port}/v1")
        assert prefix.startswith(NO_PYTHON3) and f"{BRIDGE_INSIDE}/proxy.sock" in prefix and f" {port} " in prefix
        assert box.open_proxy(f"http://127.0.0.1:{port}/v1") == prefix  # one bridge per sandbox
        with pytest.raises(ValueError, match="already bridged"):
            box.open_proxy("http://127.0.0.1:1999/v1")
        with socket.socket(socket.AF_UNIX) as client:  # what the inside half does with each connection
            client.connect(str(bridge_dir / "proxy.sock"))
            client.sendall(b"hi")
            assert client.recv(100) == b"proxy:hi"
        box.end_agent()
        assert not (bridge_dir / "proxy.sock").exists() and not container.removed  # route closed, container kept
    finally:
        server.close()
        box.close()


def test_a_bridge_in_a_directory_whose_path_is_too_long_for_a_unix_socket_still_relays(tmp_path):
    """A run's slot directory can be longer than a unix socket's 107-byte path (a CLI harness in a container failed
    with `AF_UNIX path too long` in a whole run): the bridge binds through the directory's descriptor."""
    from gyre.sandboxes.bridge import ProxyBridge

    deep = tmp_path / ("d" * 60) / ("e" * 60) / ".s0000-a-long-task-name-g00.docker" / ".bridge"
    deep.mkdir(parents=True)
    assert len(str(deep / "proxy.sock")) > 107
    server, port = _echo_server()
    bridge = ProxyBridge(("127.0.0.1", port), deep).start()
    directory = os.open(deep, os.O_RDONLY)
    try:
        with socket.socket(socket.AF_UNIX) as client:  # the inside half connects at the short path it is shown
            client.connect(f"/proc/self/fd/{directory}/proxy.sock")
            client.sendall(b"hi")
            assert client.recv(100) == b"proxy:hi"
    finally:
        os.close(directory)
        bridge.close()
        server.close()


def test_the_bridge_prefix_fails_clearly_without_python3(tmp_path):
    done = subprocess.run(["/bin/bash", "-c", NO_PYTHON3 + "echo reached"], capture_output=True, text=True,
                          env={"PATH": str(tmp_path)})  # no python3 on this PATH
    assert done.returncode == 127 and "reached" not in done.stdout
    assert "this image has no python3" in done.stderr and "harness.type: builtin" in done.stderr


def test_agent_commands_carry_a_token_and_a_timeout_kills_only_theirs(tmp_path, monkeypatch):
    released = threading.Event()

    def handler(container, cmd, kw):
        if cmd[2] == KILL_EXECS:
            released.set()  # the blocked command's processes are gone
        elif cmd[2] == "sleep 100":
            released.wait(30)
            return 137, b"", b"Killed"
        return 0, b"ok", b""

    box, container = _fake_box(tmp_path, monkeypatch, handler)
    assert box.exec("true", timeout_s=5).stdout == "ok"
    result = box.exec("sleep 100", timeout_s=0.2)
    assert result.timed_out and result.exit_code == 137 and not box.closed and container.kills == 0
    (first, first_kw), (slow, slow_kw), (kill, kill_kw) = container.calls
    assert first == ["bash", "-c", "true"] and first_kw["workdir"] == "/app" and first_kw["demux"] is True
    tokens = first_kw["environment"][EXEC_ENV], slow_kw["environment"][EXEC_ENV]
    assert len(set(tokens)) == 2 and "user" not in slow_kw  # each command its own token; the image's user
    assert kill == ["bash", "-c", KILL_EXECS, "gyre-kill", tokens[1]]  # only the timed-out command's processes
    box.close()


def test_a_command_surviving_its_kill_kills_the_container(tmp_path, monkeypatch):
    stuck = threading.Event()

    def handler(container, cmd, kw):
        if cmd[2] == "hang":  # ignores its kill
            stuck.wait(5)
        return 0, b"", b""

    box, container = _fake_box(tmp_path, monkeypatch, handler)
    monkeypatch.setattr("gyre.sandboxes.docker.STOP_WAIT_S", 0.1)
    result = box.exec("hang", timeout_s=0.1)
    stuck.set()
    assert result.timed_out and result.exit_code == -9 and container.kills == 1 and box.closed


def test_end_agent_kills_the_commands_still_running(tmp_path, monkeypatch):
    started, killed = threading.Event(), threading.Event()

    def handler(container, cmd, kw):
        if cmd[2] == "long":
            started.set()
            killed.wait(30)
        elif cmd[2] == KILL_EXECS:
            killed.set()
        return 0, b"", b""

    box, container = _fake_box(tmp_path, monkeypatch, handler)
    worker = threading.Thread(target=box.exec, args=("long", 60))
    worker.start()
    assert started.wait(10)
    box.end_agent()
    worker.join(10)
    assert not worker.is_alive()
    (long_cmd, long_kw), (kill, _) = container.calls
    assert kill == ["bash", "-c", KILL_EXECS, "gyre-kill", long_kw["environment"][EXEC_ENV]]
    box.end_agent()  # nothing running: no call
    assert len(container.calls) == 2 and not container.removed
    box.close()


def test_kill_execs_script_kills_only_the_tokens_processes(tmp_path):
    """The kill script itself, run by bash on this host against processes of this user."""
    env = {**os.environ, EXEC_ENV: "aaaa1111"}
    target = subprocess.Popen(["sleep", "60"], env=env)
    bystander = subprocess.Popen(["sleep", "60"], env={**os.environ, EXEC_ENV: "bbbb2222"})
    try:
        subprocess.run(["bash", "-c", KILL_EXECS, "gyre-kill", "aaaa1111"], check=True, timeout=30)
        assert target.wait(10) == -9
        assert bystander.poll() is None
    finally:
        for proc in (target, bystander):
            proc.kill()
            proc.wait()


def test_live_cli_route_to_the_proxy(tmp_path, docker_image):
    """A command in a container with no network reaches a host loopback server through the bridge only."""
    server, port = _echo_server()
    box = DockerSandbox.create(_query(tmp_path), tmp_path / "ws", image=docker_image)
    try:
        prefix = box.open_proxy(f"http://127.0.0.1:{port}/v1")
        result = box.exec(prefix + "python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', "
                          f"{port})); s.sendall(b'hi'); print(s.recv(100).decode())\"", timeout_s=60)
        assert result.stdout.strip() == "proxy:hi", result.stderr
    finally:
        server.close()
        box.destroy()


def test_cgroup_parent_is_under_the_memory_cgroup(tmp_path):
    v1 = tmp_path / "v1"
    v1.write_text("9:name=systemd:/\n4:memory:/ci/job-7\n3:cpu,cpuacct:/other\n0::/unified-path\n")
    assert cgroup_parent("gyre-docker", str(v1)) == "/ci/job-7/gyre-docker"
    v2 = tmp_path / "v2"
    v2.write_text("0::/user.slice/me/\n")
    assert cgroup_parent("gyre-docker", str(v2)) == "/user.slice/me/gyre-docker"
    root = tmp_path / "root"
    root.write_text("4:memory:/\n")
    assert cgroup_parent("gyre-docker", str(root)) == "/gyre-docker"
    assert cgroup_parent("", str(root)) is None
