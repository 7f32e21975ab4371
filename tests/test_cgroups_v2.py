"""cgroup v2 command cgroups (`gyre.sandboxes.local.cgroups_v2`) against a FAKE cgroupfs tree.

gyre's machines are cgroup v1 hosts, so the v2 limits are never exercised live here: the
tree under tmp_path is laid out like /sys/fs/cgroup on a v2 host, and `_mkdir` /
`_rmdir` are swapped for a fake kernfs that fills a new cgroup with its interface files
and takes them along on rmdir (a real cgroupfs does both itself). The factory test that
prefers v1 uses the real host's v1 hierarchies. Only join, kill and remove, which need
no controller, also run against a real cgroup2 mount where one is writable (a hybrid
host's `unified`), see `test_live_cgroup2_join_kill_remove`.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest

from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.local import cgroups_v2
from gyre.sandboxes.local.cgroups import CgroupV1, CommandCgroup, create_cgroup
from gyre.sandboxes.local.cgroups_v2 import PARENT_ENV, CgroupV2, delegated_parent

LIMITS = SandboxLimits(max_processes=48, memory_bytes=128 << 20, cpu_cores=0.5)
ALL_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc"


def _fake_kernfs_mkdir(path: Path, *, swap: bool = True, kill: bool = True) -> None:
    """What mkdir does on a v2 cgroupfs whose parent enabled cpu, memory and pids for its children."""
    path.mkdir()
    files = {
        "cgroup.controllers": "cpu memory pids\n",
        "cgroup.subtree_control": "",
        "cgroup.procs": "",
        "cgroup.events": "populated 0\nfrozen 0\n",
        "memory.max": "max\n",
        "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
        "pids.max": "max\n",
        "pids.events": "max 0\n",
        "cpu.max": "max 100000\n",
    }
    if swap:
        files["memory.swap.max"] = "max\n"
    if kill:
        files["cgroup.kill"] = ""
    for name, text in files.items():
        (path / name).write_text(text)


def _fake_kernfs_rmdir(path: Path) -> None:
    """rmdir on cgroupfs: the interface files go with the directory (a child cgroup would make it EBUSY)."""
    for entry in path.iterdir():
        if entry.is_dir():
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        entry.unlink()
    path.rmdir()


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A v2 root with every controller, none enabled for children yet; gyre's own cgroup is `/`."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text(ALL_CONTROLLERS + "\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("1\n")
    proc_self = tmp_path / "proc-self-cgroup"
    proc_self.write_text("0::/\n")
    monkeypatch.setattr(cgroups_v2, "_PROC_SELF_CGROUP", proc_self)
    monkeypatch.setattr(cgroups_v2, "_mkdir", _fake_kernfs_mkdir)
    monkeypatch.setattr(cgroups_v2, "_rmdir", _fake_kernfs_rmdir)
    monkeypatch.setattr(cgroups_v2, "_REMOVE_RETRIES", 3)
    monkeypatch.setattr(cgroups_v2, "_REMOVE_WAIT_S", 0.01)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    return root


def _delegated(root: Path, name: str, *, controllers: str = "cpu memory pids", subtree: str = "") -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text(subtree)
    (path / "cgroup.procs").write_text("")
    return path


def test_limits_written_with_v2_values_and_formats(fake_root: Path) -> None:
    group = CgroupV2.create(LIMITS, root=fake_root)
    assert group is not None
    assert group.path.parent == fake_root and group.path.name.startswith("gyre-")
    assert (group.path / "memory.max").read_text() == str(128 << 20)
    assert (group.path / "memory.swap.max").read_text() == "0"
    assert (group.path / "pids.max").read_text() == "48"
    assert (group.path / "cpu.max").read_text() == "50000 100000"
    assert isinstance(group, CommandCgroup)


def test_cpu_quota_has_the_kernel_minimum(fake_root: Path) -> None:
    group = CgroupV2.create(SandboxLimits(cpu_cores=0.001), root=fake_root)
    assert group is not None
    assert (group.path / "cpu.max").read_text() == "1000 100000"


def test_no_swap_accounting_leaves_swap_alone(fake_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups_v2, "_mkdir", lambda path: _fake_kernfs_mkdir(path, swap=False))
    group = CgroupV2.create(LIMITS, root=fake_root)
    assert group is not None
    assert not (group.path / "memory.swap.max").exists()  # never created: cgroupfs makes its own files
    assert (group.path / "memory.max").read_text() == str(128 << 20)


def test_controllers_enabled_in_subtree_control(fake_root: Path) -> None:
    assert CgroupV2.create(LIMITS, root=fake_root) is not None
    assert (fake_root / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"


def test_only_missing_controllers_are_enabled(fake_root: Path) -> None:
    (fake_root / "cgroup.subtree_control").write_text("memory pids io\n")
    assert CgroupV2.create(LIMITS, root=fake_root) is not None
    assert (fake_root / "cgroup.subtree_control").read_text() == "+cpu"


def test_enabled_controllers_are_not_rewritten(fake_root: Path) -> None:
    (fake_root / "cgroup.subtree_control").write_text("cpu io memory pids\n")
    assert CgroupV2.create(LIMITS, root=fake_root) is not None
    assert (fake_root / "cgroup.subtree_control").read_text() == "cpu io memory pids\n"


def test_own_cgroup_from_proc_self_cgroup(fake_root: Path, tmp_path: Path) -> None:
    own = _delegated(fake_root, "system.slice/gyre.service")
    (tmp_path / "proc-self-cgroup").write_text("1:name=systemd:/elsewhere\n0::/system.slice/gyre.service\n")
    assert delegated_parent(fake_root) == own
    group = CgroupV2.create(LIMITS, root=fake_root)
    assert group is not None and group.path.parent == own
    assert (own / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"


@pytest.mark.parametrize("spelling", ["/gyre.slice", "gyre.slice", "{root}/gyre.slice"])
def test_parent_from_env(fake_root: Path, monkeypatch: pytest.MonkeyPatch, spelling: str) -> None:
    parent = _delegated(fake_root, "gyre.slice")
    monkeypatch.setenv(PARENT_ENV, spelling.format(root=fake_root))
    group = CgroupV2.create(LIMITS, root=fake_root)
    assert group is not None and group.path.parent == parent
    assert (parent / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (fake_root / "cgroup.subtree_control").read_text() == ""  # gyre's own cgroup untouched


def test_enter_argv_really_joins(fake_root: Path) -> None:
    group = CgroupV2.create(LIMITS, root=fake_root)
    assert group is not None
    proc = subprocess.Popen([*group.enter_argv(), "true"])
    assert proc.wait(timeout=10) == 0
    assert (group.path / "cgroup.procs").read_text().split() == [str(proc.pid)]  # the shell, then exec'd `true`
    assert group.pids() == [proc.pid]


def test_command_does_not_run_if_it_cannot_join(fake_root: Path, tmp_path: Path) -> None:
    group = CgroupV2.create(LIMITS, root=fake_root)
    assert group is not None
    (group.path / "cgroup.procs").unlink()
    (group.path / "cgroup.procs").mkdir()  # writing a pid there fails
    marker = tmp_path / "ran"
    done = subprocess.run([*group.enter_argv(), "touch", str(marker)], capture_output=True, timeout=10)
    assert done.returncode == 125
    assert not marker.exists()


def test_hits_read_from_events_files(fake_root: Path) -> None:
    group = CgroupV2.create(LIMITS, root=fake_root)
    assert group is not None
    assert group.memory_limit_hits() == 0 and group.pids_limit_hits() == 0
    (group.path / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n")
    (group.path / "pids.events").write_text("max 5\n")
    assert group.memory_limit_hits() == 9  # oom_kill 2 + max 7
    assert group.pids_limit_hits() == 5
    (group.path / "pids.events").write_text("max.imposed 3\nmax 4\n")  # newer kernels add max.imposed
    assert group.pids_limit_hits() == 4
    (group.path / "memory.events").unlink()
    (group.path / "pids.events").unlink()
    assert group.memory_limit_hits() == 0 and group.pids_limit_hits() == 0


def test_kill_writes_cgroup_kill(fake_root: Path) -> None:
    group = CgroupV2.create(LIMITS, root=fake_root)
    assert group is not None
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (group.path / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        group.kill()
        assert (group.path / "cgroup.kill").read_text() == "1"
        assert sleeper.poll() is None  # the fake's cgroup.kill is a plain file: the kernel would have killed it
    finally:
        sleeper.kill()
        sleeper.wait()


def test_kill_without_cgroup_kill_sigkills_each_pid(fake_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups_v2, "_mkdir", lambda path: _fake_kernfs_mkdir(path, kill=False))
    group = CgroupV2.create(LIMITS, root=fake_root)
    assert group is not None
    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    try:
        (group.path / "cgroup.procs").write_text("".join(f"{p.pid}\n" for p in sleepers))
        group.kill()
        assert [p.wait(timeout=10) for p in sleepers] == [-9, -9]
        assert not (group.path / "cgroup.kill").exists()
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def test_kill_of_an_empty_cgroup_returns_at_once(fake_root: Path) -> None:
    group = CgroupV2.create(LIMITS, root=fake_root)
    assert group is not None
    start = time.monotonic()
    group.kill()
    assert time.monotonic() - start < 0.5
    assert (group.path / "cgroup.kill").read_text() == ""


def test_remove_deletes_the_cgroup(fake_root: Path) -> None:
    group = CgroupV2.create(LIMITS, root=fake_root)
    assert group is not None
    group.remove()
    assert not group.path.exists()
    group.remove()  # twice is fine
    assert sorted(p.name for p in fake_root.iterdir()) == ["cgroup.controllers", "cgroup.procs",
                                                             "cgroup.subtree_control"]


def test_failed_limit_write_removes_the_cgroup(fake_root: Path, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cgroups_v2, "_mkdir", lambda path: (_fake_kernfs_mkdir(path), (path / "pids.max").unlink()))
    with caplog.at_level(logging.WARNING, logger="gyre.sandboxes"):
        assert CgroupV2.create(LIMITS, root=fake_root) is None
    assert not [p for p in fake_root.iterdir() if p.name.startswith("gyre-")]
    assert "cannot write the limits" in caplog.text


def _refuse_subtree_control(monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """Make the kernel refuse cgroup.subtree_control writes (as root, chmod alone would not stop the test)."""
    real_write = cgroups_v2._write

    def write(path: Path, value: str) -> None:
        if path.name == "cgroup.subtree_control":
            raise OSError(err, os.strerror(err), str(path))
        real_write(path, value)

    monkeypatch.setattr(cgroups_v2, "_write", write)


@pytest.mark.parametrize(("err", "says"), [
    (errno.EBUSY, "no-internal-processes rule"),
    (errno.EACCES, "not delegated to this user"),
    (errno.EROFS, "read-only"),
])
def test_subtree_control_refused_means_none(fake_root: Path, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture, err: int, says: str) -> None:
    _refuse_subtree_control(monkeypatch, err)
    with caplog.at_level(logging.WARNING, logger="gyre.sandboxes"):
        assert CgroupV2.create(LIMITS, root=fake_root) is None
    assert not [p for p in fake_root.iterdir() if p.name.startswith("gyre-")]
    assert "is not a delegated subtree" in caplog.text and says in caplog.text
    assert PARENT_ENV in caplog.text  # says how to fix it


def test_already_enabled_controllers_need_no_write(fake_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (fake_root / "cgroup.subtree_control").write_text("cpu memory pids\n")
    _refuse_subtree_control(monkeypatch, errno.EACCES)
    assert CgroupV2.create(LIMITS, root=fake_root) is not None


def test_controllers_missing_means_none(fake_root: Path, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    _delegated(fake_root, "half.slice", controllers="memory pids")
    monkeypatch.setenv(PARENT_ENV, "/half.slice")
    with caplog.at_level(logging.WARNING, logger="gyre.sandboxes"):
        assert CgroupV2.create(LIMITS, root=fake_root) is None
    assert "controller(s) cpu not available" in caplog.text and "$" + PARENT_ENV in caplog.text
    assert (fake_root / "half.slice" / "cgroup.subtree_control").read_text() == ""


def test_missing_parent_means_none(fake_root: Path, monkeypatch: pytest.MonkeyPatch,
                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(PARENT_ENV, "/no/such.slice")
    with caplog.at_level(logging.WARNING, logger="gyre.sandboxes"):
        assert CgroupV2.create(LIMITS, root=fake_root) is None
    assert "no/such.slice" in caplog.text and "not usable" in caplog.text


def test_not_a_v2_hierarchy_means_none(tmp_path: Path) -> None:
    assert CgroupV2.create(LIMITS, root=tmp_path) is None  # no cgroup.controllers: v1 or nothing mounted


def test_factory_prefers_v1_where_it_works() -> None:
    probe = CgroupV1.create(SandboxLimits())
    if probe is None:
        pytest.skip("no usable cgroup v1 hierarchy on this host")
    probe.remove()
    group = create_cgroup(LIMITS)
    assert isinstance(group, CgroupV1) and isinstance(group, CommandCgroup)
    group.remove()


def test_factory_falls_back_to_v2(fake_root: Path) -> None:
    group = create_cgroup(LIMITS, root=fake_root)  # no v1 hierarchies under the fake root
    assert isinstance(group, CgroupV2)
    assert (group.path / "pids.max").read_text() == "48"
    group.remove()
    assert not group.path.exists()


def test_factory_none_when_neither(tmp_path: Path) -> None:
    assert create_cgroup(LIMITS, root=tmp_path) is None


def _live_cgroup2_parent() -> Path | None:
    """This process's cgroup in a real cgroup2 mount (a hybrid host's `unified`, a v2 host's root), if writable."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.split()[2] == "cgroup2"]
    own = cgroups_v2.own_cgroup_v2()
    if not mounts or own is None:
        return None
    parent = Path(mounts[0]) / own.lstrip("/")
    return parent if os.access(parent, os.W_OK) else None


@pytest.mark.parametrize("via_cgroup_kill", [True, False])
def test_live_cgroup2_join_kill_remove(monkeypatch: pytest.MonkeyPatch, via_cgroup_kill: bool) -> None:
    """The parts that need no controller, on the real kernel: join, kill (cgroup.kill or SIGKILL), rmdir.

    No limits are written (on a v1 host the unified hierarchy has no memory/pids/cpu controllers),
    so this is NOT a live test of the v2 limits.
    """
    parent = _live_cgroup2_parent()
    if parent is None:
        pytest.skip("no writable cgroup2 mount")
    if not via_cgroup_kill:
        monkeypatch.setattr(CgroupV2, "_cgroup_kill", lambda self: False)
    group = CgroupV2(parent / f"gyre-test-{os.getpid()}-{int(via_cgroup_kill)}")
    try:
        cgroups_v2._mkdir(group.path)
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup in {parent}: {exc}")
    try:
        proc = subprocess.Popen([*group.enter_argv(), "sh", "-c", "sleep 30 & sleep 30 & wait"])
        deadline = time.monotonic() + 10
        while len(group.pids()) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() == 125:
            pytest.skip(f"not allowed to move a process into {group.path}")
        assert proc.pid in group.pids() and len(group.pids()) == 3  # the shell and both sleeps
        group.kill()
        assert proc.wait(timeout=10) == -9
        assert group.pids() == []
    finally:
        group.remove()
    assert not group.path.exists()
