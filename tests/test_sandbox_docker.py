"""DockerSandbox: container arguments and backend selection unit-tested (the docker SDK faked at
the edge), the preflight error without an engine checked for real; live tests only where a
Docker engine answers."""

from __future__ import annotations

import sys
import types

import pytest
from pydantic import ValidationError

from gyre.config import RunConfig, SandboxConfig
from gyre.records import Query
from gyre.resolve import preflight
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.docker import DockerSandbox, container_kwargs
from gyre.sandboxes.factory import SandboxBackendError, create_sandbox
from gyre.sandboxes.isolation import Isolation
from gyre.sandboxes.local import LocalSandbox


def _engine_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:  # no SDK or no daemon: the live test is skipped with the reason below
        return False


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


@pytest.mark.skipif(not _engine_available(), reason="no Docker engine answers on this machine (docker.from_env() fails)")
def test_live_container_runs_without_network(tmp_path):
    from gyre.records import Query
    from gyre.sandboxes.docker import DockerSandbox

    (tmp_path / "h").mkdir()
    query = Query(query_id="q", benchmark="t", instruction="x", root=tmp_path, hidden_tests_dir=tmp_path / "h",
                  test_files=["a"], test_commands=["x"], test_case_count=1)
    sandbox = DockerSandbox.create(query, tmp_path / "ws")
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
    config = RunConfig.model_validate({"sandbox": {"type": "docker"}, "harness": {"type": "claude-code"}})
    with pytest.raises(SandboxBackendError, match="only harness.type 'builtin'"):
        preflight(config)  # a CLI harness in a container could not reach the proxy


def test_create_sandbox_starts_a_container_for_docker_and_a_local_sandbox_otherwise(tmp_path, monkeypatch):
    started: list[dict] = []

    class FakeContainers:
        def run(self, **kwargs):
            started.append(kwargs)
            return types.SimpleNamespace(remove=lambda force: None)

    fake_sdk = types.ModuleType("docker")
    fake_sdk.from_env = lambda **_: types.SimpleNamespace(containers=FakeContainers())
    monkeypatch.setitem(sys.modules, "docker", fake_sdk)  # the SDK is the outer edge
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

    local_box = create_sandbox(SandboxConfig(), query, tmp_path / "ws-l", env, limits, isolation)
    assert isinstance(local_box, LocalSandbox) and len(started) == 2
    local_box.close()
