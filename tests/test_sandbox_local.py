"""LocalSandbox: real processes in a real workspace under tmp_path."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gyre.records import Query
from gyre.sandboxes.base import Sandbox, SandboxLimits
from gyre.sandboxes.local.isolation import cgroups_usable, probe_bwrap
from gyre.sandboxes.local.sandbox import LocalSandbox

needs_bwrap = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable (apt-get install -y bubblewrap)")
ISOLATIONS = [pytest.param("bwrap", marks=needs_bwrap), "none"]


def _query(tmp_path: Path, with_start: bool = True) -> Query:
    root = tmp_path / "bench" / "proj"
    (root / "hidden_tests" / "tests").mkdir(parents=True)
    (root / "hidden_tests" / "tests" / "test_secret.py").write_text("def test_x(): pass\n")
    if with_start:
        (root / "start" / "pkg").mkdir(parents=True)
        (root / "start" / "pkg" / "README.md").write_text("starting file\n")
    return Query(
        query_id="proj",
        benchmark="test",
        instruction="do it",
        root=root,
        start_dir=root / "start" if with_start else None,
        hidden_tests_dir=root / "hidden_tests",
        test_files=["tests/test_secret.py"],
        test_commands=["python -m pytest tests"],
        test_case_count=1,
    )


def _gone(pid: int, within_s: float = 3.0) -> bool:
    """True once `pid` no longer runs (absent, or a zombie waiting to be reaped)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_create_copies_start_files_but_never_hidden_tests(tmp_path):
    sandbox = LocalSandbox.create(_query(tmp_path), tmp_path / "ws")
    assert isinstance(sandbox, Sandbox)
    files = sorted(p.relative_to(sandbox.workspace).as_posix() for p in sandbox.workspace.rglob("*"))
    assert files == ["pkg", "pkg/README.md"]
    assert sandbox.read_file("pkg/README.md") == "starting file\n"


def test_create_refuses_non_empty_workspace(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "old.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        LocalSandbox.create(_query(tmp_path), tmp_path / "ws")


def test_exec_runs_bash_in_the_workspace(tmp_path):
    sandbox = LocalSandbox.create(_query(tmp_path, with_start=False), tmp_path / "ws")
    result = sandbox.exec("echo hi > out.txt; pwd; echo oops >&2; exit 3", timeout_s=10)
    assert result.exit_code == 3
    assert result.stdout == f"{sandbox.workspace}\n"
    assert result.stderr == "oops\n"
    assert not result.timed_out
    assert sandbox.read_file("out.txt") == "hi\n"


def test_env_is_scrubbed(tmp_path, monkeypatch):
    monkeypatch.setenv("GYRE_FAKE_SECRET", "hunter2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter3")
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "exec-key"}
    sandbox = LocalSandbox.create(_query(tmp_path), tmp_path / "ws", env=env)
    result = sandbox.exec("env", timeout_s=10)
    inside = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert "hunter2" not in result.stdout and "hunter3" not in result.stdout
    assert inside["HOME"] == str(sandbox.workspace)
    assert inside["OPENAI_BASE_URL"] == env["OPENAI_BASE_URL"]
    assert inside["OPENAI_API_KEY"] == "exec-key"
    assert inside["LC_ALL"] == "C.UTF-8" and inside["PYTHONDONTWRITEBYTECODE"] == "1"
    allowed = {"PATH", "HOME", "LANG", "LC_ALL", "PYTHONDONTWRITEBYTECODE", *env, "PWD", "SHLVL", "_"}
    assert set(inside) <= allowed


def _running(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (to check a sandbox left nothing behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
    return [pid for pid in found if not _gone(pid, within_s=0.0)]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_timeout_kills_process_tree_and_keeps_workspace(tmp_path, isolation):
    sandbox = LocalSandbox.create(_query(tmp_path), tmp_path / "ws", isolation=isolation)
    command = "echo started; touch before.txt; (setsid sleep 31.25; touch after.txt) & sleep 30"
    result = sandbox.exec(command, timeout_s=1.0)
    assert result.timed_out
    assert result.stdout == "started\n"
    assert result.duration_s < 5
    if isolation == "bwrap" or cgroups_usable():  # plain process groups cannot catch setsid()
        assert _running("sleep 31.25") == []
    assert (sandbox.workspace / "before.txt").exists()
    assert not (sandbox.workspace / "after.txt").exists()
    assert sandbox.exec("ls", timeout_s=10).stdout.split() == ["before.txt", "pkg"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_background_processes_end_with_their_command_and_close_keeps_workspace(tmp_path, isolation):
    sandbox = LocalSandbox.create(_query(tmp_path), tmp_path / "ws", isolation=isolation)
    result = sandbox.exec("sleep 32.5 >/dev/null 2>&1 & echo started", timeout_s=10)
    assert result.duration_s < 5 and not result.timed_out and result.stdout == "started\n"
    assert _running("sleep 32.5") == []
    sandbox.close()
    assert (sandbox.workspace / "pkg" / "README.md").exists()
    with pytest.raises(RuntimeError, match="closed"):
        sandbox.exec("true", timeout_s=1)
    sandbox.destroy()
    assert not sandbox.workspace.exists()


def test_paths_escaping_the_workspace_are_rejected(tmp_path):
    (tmp_path / "host_secret.txt").write_text("secret\n")
    sandbox = LocalSandbox.create(_query(tmp_path), tmp_path / "ws")
    sandbox.write_file("a/b/c.txt", "ok")
    assert sandbox.read_file("a/b/c.txt") == "ok"
    os.symlink(tmp_path, sandbox.workspace / "outside")
    os.symlink(tmp_path / "host_secret.txt", sandbox.workspace / "link.txt")
    for bad in ("../host_secret.txt", str(tmp_path / "host_secret.txt"), "a/../../host_secret.txt",
                "outside/host_secret.txt", "link.txt", ""):
        with pytest.raises(ValueError, match="workspace"):
            sandbox.read_file(bad)
        with pytest.raises(ValueError, match="workspace"):
            sandbox.write_file(bad, "pwned")
    assert (tmp_path / "host_secret.txt").read_text() == "secret\n"


def test_output_is_truncated_with_a_marker(tmp_path):
    limits = SandboxLimits(max_output_bytes=1000)
    sandbox = LocalSandbox.create(_query(tmp_path), tmp_path / "ws", limits=limits)
    result = sandbox.exec("head -c 100000 /dev/zero | tr '\\0' a; echo END; echo short >&2", timeout_s=10)
    assert result.exit_code == 0
    assert result.stdout.startswith("a" * 500)
    assert result.stdout.endswith("a" * 496 + "END\n")
    assert "[... gyre: 99004 bytes of output truncated ...]" in result.stdout
    assert len(result.stdout) < 1100
    assert result.stderr == "short\n"


def test_rlimits_apply(tmp_path):
    limits = SandboxLimits(max_file_bytes=4096, max_open_files=64)
    sandbox = LocalSandbox.create(_query(tmp_path), tmp_path / "ws", limits=limits)
    result = sandbox.exec("ulimit -n; head -c 100000 /dev/zero > big.bin", timeout_s=10)
    assert result.stdout == "64\n"
    assert result.exit_code != 0
    assert (sandbox.workspace / "big.bin").stat().st_size <= 4096


def test_python_installation_stays_visible_when_it_lives_under_tmp(tmp_path):
    """A CI clone's venv can sit under /tmp: the scratch /tmp must be mounted before it."""
    from gyre.sandboxes.layout import SandboxLayout
    from gyre.sandboxes.local.bwrap import bwrap_argv, python_prefixes

    argv = bwrap_argv("bwrap", workspace=tmp_path / "ws", scratch=tmp_path / "scratch", layout=SandboxLayout())
    tmp_bind = argv.index("/tmp", argv.index(str(tmp_path / "scratch")))
    for prefix in python_prefixes():
        assert argv.index(str(prefix)) > tmp_bind, prefix


@pytest.fixture
def open_dir(tmp_path):
    """A directory every user can reach (tmp_path's own parents are 0700), like a run directory."""
    import shutil
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="gyre-open-", dir="/tmp"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_only_sources_no_user_could_reach_are_staged(open_dir):
    from gyre.sandboxes.local.privileges import SandboxUser, Stage, drop_argv, open_to_all

    reachable, closed, odd = open_dir / "a", open_dir / "closed" / "b", open_dir / "odd" / "c"
    for path in (reachable, closed, odd):
        path.mkdir(parents=True)
    (open_dir / "closed").chmod(0o700)
    (open_dir / "odd").chmod(0o701)  # others may search, its group may not: not every user can
    link = open_dir / "link"
    link.symlink_to(reachable)
    assert open_to_all(reachable) and open_to_all(open_dir / "a" / "missing-file")
    assert not any(open_to_all(p) for p in (closed, odd, link, link / "x", Path("relative")))
    stage = Stage.create([reachable, closed, odd, link])
    try:
        assert list(stage.binds) == [closed, odd, link] and stage.staged(reachable) == reachable
        assert drop_argv(SandboxUser(), stage, ("unshare", "setpriv"))[0] == "unshare"
    finally:
        stage.remove()
    stage = Stage.create([reachable])
    try:
        assert drop_argv(SandboxUser(), stage, ("unshare", "setpriv"))[0] == "setpriv"  # no prelude at all
    finally:
        stage.remove()


@needs_bwrap
def test_a_sandbox_whose_paths_anyone_can_reach_runs_without_staging_them(tmp_path, open_dir):
    sandbox = LocalSandbox.create(_query(tmp_path), open_dir / "runs" / "ws", isolation="bwrap")
    result = sandbox.exec("echo hi > out.txt && cat out.txt && touch /tmp/t /dev/shm/s && ls -A /dev/shm", timeout_s=20)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["hi", "s"]
    if os.geteuid() == 0:  # dropped: the files belong to the sandbox user on the host
        assert (sandbox.workspace / "out.txt").stat().st_uid == 65534


def test_auto_isolation_refuses_to_run_agent_code_as_root_unconfined(monkeypatch):
    """A sandbox that cannot be built is loud: as root, `auto` without bubblewrap is an error naming the fix,
    and only an explicit `none` runs unconfined."""
    from gyre.sandboxes.local import isolation as module

    monkeypatch.setattr(module, "probe_bwrap", lambda: None)
    monkeypatch.setattr(module.os, "geteuid", lambda: 0)
    with pytest.raises(RuntimeError, match="runs as root.*sandbox.isolation: none"):
        module.Isolation.detect("auto")
    assert module.Isolation.detect("none").bwrap is None
