"""Attack suite, host races: nothing gyre does as root on a workspace path can be redirected to a host file.

The agent controls its workspace and may leave processes running that swap entries for symlinks
to host paths while gyre works on the tree (the review's three routes to the host, rebuilt here):
(a) an in-place evaluation's ACL grant, walked as root beside a process exchanging a file and a
link in a directory of thousands of entries; (b) the builtin harness's file tools while a
background process flips a directory and a link to a root-only host directory; (c) a setuid bit
the agent set surviving on the kept workspace, and a root-made copy of it. Each checks the host by
what changed there (mode, owner, ACL, content, entries), never by what gyre says.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gyre.evaluators.environments.workspace_copy import copy_workspace
from gyre.evaluators.formats.in_place import grant_access
from gyre.records import Query
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.layout import SandboxLayout
from gyre.sandboxes.local.freeze import members
from gyre.sandboxes.local.isolation import probe_bwrap
from gyre.sandboxes.local.sandbox import LocalSandbox

pytestmark = [
    pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable: attack suite needs it"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the races only reach the host when gyre is root"),
]

LIMITS = SandboxLimits(max_processes=64, memory_bytes=256 << 20, max_workspace_bytes=64 << 20,
                       max_workspace_files=50_000, max_output_bytes=8192)
ACL_ACCESS = "system.posix_acl_access"


def _sandbox(tmp_path: Path, session: bool) -> LocalSandbox:
    root = tmp_path / "bench"
    (root / "hidden").mkdir(parents=True)
    query = Query(query_id="q", benchmark="attack", instruction="x", root=root, hidden_tests_dir=root / "hidden",
                  test_files=[], test_commands=["true"], test_case_count=1)
    return LocalSandbox.create(query, tmp_path / "ws", limits=LIMITS, isolation="bwrap",
                               layout=SandboxLayout(workdir="/app"), session_slots={} if session else None)


def _host_state(path: Path) -> tuple:
    st = os.lstat(path)
    try:
        acl = os.getxattr(path, ACL_ACCESS, follow_symlinks=False)
    except OSError:
        acl = None
    content = path.read_bytes() if path.is_file() else sorted(p.name for p in path.iterdir())
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, acl, content


def _host_victims(tmp_path: Path) -> tuple[Path, Path]:
    """A root-owned 0644 file and a root-only 0700 directory holding a 0600 secret."""
    victim = tmp_path / "host" / "config"
    victim.parent.mkdir()
    victim.write_text("root's file\n")
    victim.chmod(0o644)
    private = tmp_path / "host" / "private"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("root's secret\n")
    (private / "secret").chmod(0o600)
    return victim, private


def test_an_in_place_acl_grant_never_reaches_a_host_file_a_running_process_swaps_in(tmp_path):
    """(a) A process left running exchanges a file and a link to a host file (renameat2 EXCHANGE) in a
    directory of 20,000 entries while the evaluation grants its user access: before, `setxattr` followed
    the link and the host file became world-writable (3 runs of 3)."""
    victim, _ = _host_victims(tmp_path)
    before = _host_state(victim)
    sandbox = _sandbox(tmp_path, session=True)
    swapper = (
        "import ctypes, os\n"
        "os.makedirs('big', exist_ok=True)\n"
        "for i in range(20000): open(f'big/f{i:05d}', 'w').close()\n"
        f"os.symlink({str(victim)!r}, 'big/link')\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('swapping', flush=True)\n"
        "while True: libc.renameat2(-100, b'big/f10000', -100, b'big/link', 2)\n"
    )
    sandbox.write_file("swap.py", swapper)
    started = sandbox.exec("(python3 swap.py > swapping.txt 2>&1 &); for i in $(seq 300); do "
                           "grep -q swapping swapping.txt && break; sleep 0.2; done; cat swapping.txt", timeout_s=90)
    assert "swapping" in started.stdout, started
    try:
        for _ in range(5):
            with sandbox.session().frozen() as stopped:
                assert any(b"swap.py" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in stopped)
            grant_access(sandbox.workspace, sandbox.session().frozen())
        # the freeze ended with each grant: the agent's process runs on
        swappers = [pid for pid in members(sandbox.session().init_pid)
                    if b"swap.py" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert swappers and all(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T"
                                for pid in swappers)
    finally:
        sandbox.close()
    assert _host_state(victim) == before
    # the workspace itself got the grant (the evaluation's user can read what the agent wrote)
    assert os.getxattr(sandbox.workspace / "swap.py", ACL_ACCESS)


def test_file_tools_never_write_or_read_through_a_link_a_background_process_flips(tmp_path):
    """(b) A background process flips `d` between a directory and a link to a root-only host directory
    while the builtin harness writes `d/x.txt` and reads `d/secret`: before, a host-side check and a
    root open raced (a host write after 41 and 147 tool calls, a 0600 file read after 806)."""
    _, private = _host_victims(tmp_path)
    before = _host_state(private), _host_state(private / "secret")
    sandbox = _sandbox(tmp_path, session=True)
    flip = f"while :; do rm -rf d; mkdir d; rmdir d; ln -s {private} d; rm -f d; done"
    sandbox.exec(f"(bash -c {flip!r} >/dev/null 2>&1 &); true", timeout_s=20)
    read = written = 0
    try:
        for i in range(3000):  # 300 tries, more until one write has met `d` as a directory (a loaded box)
            if i >= 300 and written:
                break
            try:
                sandbox.write_file("d/x.txt", f"written {i}\n")
                written += 1
            except (OSError, ValueError):
                pass
            try:
                text = sandbox.read_file("d/secret")
            except (OSError, ValueError):
                continue
            read += 1
            assert "secret" not in text
    finally:
        sandbox.close()
    assert (_host_state(private), _host_state(private / "secret")) == before
    assert written > 0  # some writes met `d` as a directory: the tools did run all along


def test_a_setuid_bit_survives_neither_the_kept_workspace_nor_a_copy(tmp_path):
    """(c) The agent marks a program setuid: closed, its kept workspace holds no setuid file (a host user
    ran it as uid 65534), and the evaluation's root-made copy is never a setuid-root program."""
    sandbox = _sandbox(tmp_path, session=False)
    made = sandbox.exec("cp /bin/true prog && chmod 6755 prog && mkdir -m 3777 shared && stat -c %a prog shared",
                        timeout_s=20)
    assert made.stdout.split() == ["6755", "3777"], made
    sandbox.close()
    kept = sandbox.workspace
    assert stat.S_IMODE(os.stat(kept / "prog").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(kept / "shared").st_mode) == 0o777
    # a workspace rescored later, its bits set again (a rerun of an old run's workspace)
    os.chmod(kept / "prog", 0o6755)
    os.mknod(kept / "dev", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    copy = tmp_path / "copy"
    assert copy_workspace(kept, copy, LIMITS) is None
    st = os.stat(copy / "prog")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    assert not (copy / "dev").exists()
    assert stat.S_IMODE(os.stat(copy / "shared").st_mode) == 0o777
