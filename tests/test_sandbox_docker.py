"""DockerSandbox: container arguments unit-tested; live tests only where a Docker engine answers."""

from __future__ import annotations


import pytest

from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.docker import container_kwargs


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
