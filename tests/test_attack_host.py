"""Attack suite, host side: a sandboxed command must never act as the host's root or change host state.

Run as root (CI and our machines are), bubblewrap alone maps the sandbox to host uid 0.
These attacks check the walls by what a command can WRITE, never by what
`/proc/self/uid_map` says (it reads the same after the drop). A probe of a host setting
only ever writes back the value it read, so even a failing wall changes nothing on the
host.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gyre.records import Query
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.layout import Mount, SandboxLayout
from gyre.sandboxes.local.isolation import Isolation, cgroups_usable, probe_bwrap
from gyre.sandboxes.local.privileges import SANDBOX_UID
from gyre.sandboxes.local.sandbox import LocalSandbox

pytestmark = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable: attack suite needs it")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the uid-0 attacks only mean something when gyre is root")

LIMITS = SandboxLimits(max_processes=64, memory_bytes=256 << 20, max_workspace_bytes=8 << 20,
                       max_workspace_files=2000, max_output_bytes=8192)


def _sandbox(tmp_path: Path, **kwargs) -> LocalSandbox:
    root = tmp_path / "bench"
    (root / "hidden").mkdir(parents=True)
    query = Query(query_id="q", benchmark="attack", instruction="x", root=root, hidden_tests_dir=root / "hidden",
                  test_files=[], test_commands=["true"], test_case_count=1)
    return LocalSandbox.create(query, tmp_path / "ws", limits=LIMITS, isolation="bwrap", **kwargs)


@pytest.mark.parametrize("setting", ["kernel/core_pattern", "kernel/hostname", "vm/overcommit_memory",
                                     "net/ipv4/ip_forward"])
def test_proc_sys_is_read_only(tmp_path, setting):
    path = Path("/proc/sys") / setting
    if not path.exists():
        pytest.skip(f"{path} does not exist on this kernel")
    before = path.read_text()
    # writes back exactly what it read: even a failing wall changes nothing on the host
    write = f'v=$(cat /proc/sys/{setting}); printf "%s\\n" "$v" > /proc/sys/{setting}; echo rc=$?'
    result = _sandbox(tmp_path).exec(write, timeout_s=20)
    assert "rc=1" in result.stdout, result
    assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr
    assert path.read_text() == before


def test_host_state_in_proc_and_dev_is_not_writable(tmp_path):
    result = _sandbox(tmp_path).exec(
        "for f in /proc/sysrq-trigger /proc/irq/default_smp_affinity /dev/planted /etc/ssh/planted; do "
        "  ( : > $f ) 2>/dev/null && echo WROTE $f; done; echo done", timeout_s=20)
    assert result.stdout.strip().endswith("done") and "WROTE" not in result.stdout, result


def test_no_writable_memory_outside_the_limits(tmp_path):
    """The sandbox's root is a tmpfs: writable, it would hold files outside the disk watch."""
    done = _sandbox(tmp_path).exec("for d in / /run /srv /opt; do touch $d/x 2>/dev/null && echo wrote $d; done; "
                                   "mkdir /newdir 2>/dev/null && echo made", timeout_s=60)
    assert "wrote" not in done.stdout and "made" not in done.stdout, done


@as_root
def test_sandbox_is_never_host_root(tmp_path):
    sandbox = _sandbox(tmp_path)
    owned = tmp_path / "ws" / "root_owned.txt"
    owned.write_text("root's\n")
    os.chown(owned, 0, 0)
    owned.chmod(0o644)
    result = sandbox.exec("echo pwned > root_owned.txt; echo rc=$?; echo mine > new.txt; id -u", timeout_s=20)
    assert "rc=1" in result.stdout and owned.read_text() == "root's\n"
    assert (tmp_path / "ws" / "new.txt").stat().st_uid == SANDBOX_UID  # host-side owner: unprivileged


@as_root
def test_writable_bind_cannot_touch_root_owned_files(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "keep.txt").write_text("host\n")
    sandbox = _sandbox(tmp_path)
    sandbox.layout = SandboxLayout(mounts=(Mount(shared, "/shared", writable=True),))
    # a writable mount is the sandbox's directory (it may add or remove entries), but a
    # root-owned file in it can be neither rewritten nor have its mode changed
    result = sandbox.exec("echo x > /shared/keep.txt; chmod 777 /shared/keep.txt; ln -f /shared/keep.txt /shared/l; "
                          "ls -l /shared", timeout_s=20)
    assert (shared / "keep.txt").read_text() == "host\n"
    assert (shared / "keep.txt").stat().st_mode & 0o777 == 0o644, result


def test_seccomp_denies_namespaces_keyrings_and_bpf(tmp_path):
    probe = (
        "import ctypes, errno, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, nr, args in [('keyctl', 250, (0, 0)), ('bpf', 321, (0, 0, 0)), ('unshare', 272, (0x10000000,)),"
        " ('mount', 165, (0, 0, 0, 0, 0)), ('ptrace', 101, (16, 1, 0, 0)), ('init_module', 175, (0, 0, 0))]:\n"
        "    rc = libc.syscall(nr, *args)\n"
        "    print(name, rc, errno.errorcode.get(ctypes.get_errno()))\n"
    )
    result = _sandbox(tmp_path).exec(f"python3 -c \"{probe}\"; unshare -U true; echo unshare=$?", timeout_s=20)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    for name in ("keyctl", "bpf", "unshare", "mount", "ptrace", "init_module"):
        assert lines[name] == "-1 EPERM", result
    assert "unshare=1" in result.stdout


def test_ordinary_work_still_runs_under_the_filter(tmp_path):
    script = (
        "import multiprocessing, subprocess, threading\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "subprocess.run(['true'], check=True)\n"
        "import multiprocessing.shared_memory as s; m = s.SharedMemory(create=True, size=4096); m.close(); m.unlink()\n"
        "if __name__ == '__main__':\n"
        "    with multiprocessing.Pool(2) as pool: print(sum(pool.map(abs, [-1, -2])))\n"
    )
    sandbox = _sandbox(tmp_path)
    sandbox.write_file("work.py", script)
    result = sandbox.exec("python3 work.py && git init -q repo && echo ok", timeout_s=60)
    assert result.exit_code == 0 and result.stdout.split() == ["thread", "3", "ok"], result


@pytest.mark.skipif(not cgroups_usable(), reason="the disk watch is what bounds it; run with cgroups where usable")
def test_shared_memory_counts_against_the_disk_limit(tmp_path):
    result = _sandbox(tmp_path).exec(
        "for i in $(seq 64); do head -c 1000000 /dev/zero > /dev/shm/f$i || exit 9; sleep 0.02; done", timeout_s=20)
    assert (result.limit_hit or "").startswith("disk limit"), result


def test_files_gyre_writes_stay_editable_by_the_agent(tmp_path):
    sandbox = _sandbox(tmp_path)
    sandbox.write_file("pkg/deep/mod.py", "x = 1\n")
    result = sandbox.exec("echo 'x = 2' > pkg/deep/mod.py && touch pkg/deep/new.py && echo ok", timeout_s=20)
    assert result.stdout.strip() == "ok", result


def test_probe_runs_the_same_chain_as_every_command():
    isolation = Isolation.detect("bwrap")
    assert isolation.user is not None if os.geteuid() == 0 else isolation.user is None


def test_a_scratch_tree_deeper_than_any_recursion_is_still_cleaned_up(tmp_path):
    sandbox = _sandbox(tmp_path)
    script = "import os\nos.chdir('/tmp')\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\nprint('made')\n"
    sandbox.write_file("deep.py", script)
    result = sandbox.exec("python3 deep.py", timeout_s=60)
    assert result.stdout.strip() == "made", result
    sandbox.close()  # must not raise RecursionError
    assert not sandbox.scratch.exists()
