"""The seccomp deny-list, loaded by a real bubblewrap around real commands (no mocks)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from gyre.sandboxes.local import seccomp
from gyre.sandboxes.local.seccomp import seccomp_bpf

BWRAP = shutil.which("bwrap")
PY = sys.executable
TIMEOUT_S = 30


def _bwrap(cmd: list[str], *, with_filter: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `cmd` under bwrap (root bound read-only), with the filter on a pipe unless with_filter is False."""
    assert BWRAP is not None
    argv = [BWRAP, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    if not with_filter:
        return subprocess.run([*argv, "--", *cmd], capture_output=True, text=True, timeout=TIMEOUT_S)
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, seccomp_bpf())  # a few hundred bytes: fits the pipe buffer
        os.close(write_fd)
        write_fd = -1
        argv += ["--seccomp", str(read_fd)]
        return subprocess.run([*argv, "--", *cmd], capture_output=True, text=True, timeout=TIMEOUT_S,
                              pass_fds=(read_fd,))
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def _bwrap_works() -> str | None:
    """None if bwrap can run `true` with this test's flags, else why not."""
    if BWRAP is None:
        return "bubblewrap missing (apt-get install -y bubblewrap)"
    try:
        done = _bwrap(["true"], with_filter=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap unusable: {exc}"
    return None if done.returncode == 0 else f"bwrap unusable: {done.stderr.strip()[-300:]}"


_BWRAP_PROBLEM = _bwrap_works()
needs_bwrap = pytest.mark.skipif(_BWRAP_PROBLEM is not None, reason=_BWRAP_PROBLEM or "")
x86_64_only = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86_64 syscall numbers / machine code")


# Raw syscalls through libc's syscall(); prints {name: "ok" | errno name}. x86_64 numbers.
DENIED_CALLS_SNIPPET = textwrap.dedent("""
    import ctypes, errno, json, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    def call(*args):
        ctypes.set_errno(0)
        res = libc.syscall(*[ctypes.c_long(a) for a in args])
        return "ok" if res >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))

    def in_child(fn):
        # ptrace(TRACEME) is judged against the parent's capabilities: run it under this process.
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, fn().encode())
            os._exit(0)
        os.close(w)
        out = os.read(r, 100).decode()
        os.waitpid(pid, 0)
        return out

    def clone_newuser():
        res = call(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
        if res == "ok" and os.getpid() != PARENT:  # the child of a successful clone
            os._exit(0)
        if res == "ok":
            os.wait()
        return res

    PARENT = os.getpid()
    slash = ctypes.cast(ctypes.c_char_p(b"/"), ctypes.c_void_p).value
    print(json.dumps({
        "keyctl": call(250, 0, -3, 0),              # KEYCTL_GET_KEYRING_ID(session keyring)
        "bpf": call(321, 1000, 0, 0),               # unknown command: EINVAL if bpf is reachable
        "ptrace": in_child(lambda: call(101, 0, 0, 0, 0)),   # PTRACE_TRACEME
        "mount": call(165, 0, slash, 1, 0, 0),      # bad fstype pointer: EFAULT if mount is reachable
        "clone_newuser": clone_newuser(),
        "clone3": call(435, 0, 0),                  # size 0: EINVAL if clone3 is reachable
    }))
""")


def test_denied_constants_and_resolution():
    assert len(set(seccomp.DENIED_SYSCALLS)) == len(seccomp.DENIED_SYSCALLS)
    important = {"mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "keyctl", "add_key",
                 "request_key", "ptrace", "process_vm_readv", "process_vm_writev", "init_module",
                 "finit_module", "bpf", "perf_event_open", "kexec_load", "open_by_handle_at",
                 "userfaultfd", "move_mount", "open_tree", "fsopen", "fsmount"}
    assert important <= set(seccomp.DENIED_SYSCALLS)
    assert seccomp.ENOSYS_SYSCALLS == ("clone3",)
    unresolved = set(seccomp.unresolved_syscalls())
    assert not (important & unresolved), f"libseccomp does not know {sorted(important & unresolved)}"
    assert "clone3" not in unresolved
    assert seccomp._native_number("clone") >= 0


def test_bpf_program_shape():
    prog = seccomp_bpf()
    assert prog is seccomp_bpf()  # cached
    assert isinstance(prog, bytes) and len(prog) % 8 == 0  # struct sock_filter is 8 bytes
    assert 10 < len(prog) // 8 <= 4096  # BPF_MAXINSNS


@needs_bwrap
def test_unshare_denied():
    for flag in ("-U", "-m"):
        done = _bwrap(["unshare", flag, "true"])
        assert done.returncode != 0, f"unshare {flag} succeeded under the filter"
        assert "Operation not permitted" in done.stderr


@needs_bwrap
@x86_64_only
def test_denied_calls_fail_with_eperm():
    done = _bwrap([PY, "-c", DENIED_CALLS_SNIPPET])
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert results.pop("clone3") == "ENOSYS"  # so that glibc falls back to clone
    assert results == {name: "EPERM" for name in results}, results


@needs_bwrap
@x86_64_only
@pytest.mark.skipif(os.geteuid() != 0, reason="without root's capabilities the kernel itself answers EPERM")
def test_same_calls_reach_the_kernel_without_the_filter():
    """Control: the EPERMs above come from the filter, not from bwrap or the host."""
    done = _bwrap([PY, "-c", DENIED_CALLS_SNIPPET], with_filter=False)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert "EPERM" not in results.values() and results["clone3"] != "ENOSYS", results
    for flag in ("-U", "-m"):
        assert _bwrap(["unshare", flag, "true"], with_filter=False).returncode == 0


ORDINARY_COMMANDS = {
    "bash": ["bash", "-c", "echo hi | cat; x=$(true); exit 0"],
    "threads": [PY, "-c", "import threading\n"
                "out = []\nts = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]\n"
                "[t.start() for t in ts]; [t.join() for t in ts]\nassert sorted(out) == [0, 1, 2, 3]"],
    "subprocess": [PY, "-c", 'import subprocess; subprocess.run(["true"], check=True)'],
    "fork": [PY, "-c", "import os\npid = os.fork()\nif pid == 0: os._exit(7)\n"
             "assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7"],
    "multiprocessing": [PY, "-c", "import multiprocessing as mp\n"
                        "if __name__ == '__main__':\n"
                        "    with mp.Pool(2) as pool: assert pool.map(abs, [-1, -2, 3]) == [1, 2, 3]"],
}


@needs_bwrap
@pytest.mark.parametrize("name", sorted(ORDINARY_COMMANDS))
def test_ordinary_commands_still_work(name: str):
    done = _bwrap(ORDINARY_COMMANDS[name])
    assert done.returncode == 0, f"{name}: exit {done.returncode}: {done.stderr[-2000:]}"


@needs_bwrap
@x86_64_only
def test_x32_syscall_kills_the_process():
    # getpid with the x32 bit: not the native ABI, so libseccomp's arch check kills with SIGSYS.
    done = _bwrap([PY, "-c", "import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 39); print('survived')"])
    assert "survived" not in done.stdout
    assert done.returncode == 128 + signal.SIGSYS, (done.returncode, done.stderr)


I386_FROM_THREAD = textwrap.dedent("""
    import ctypes, mmap, os, threading, time
    code = bytes.fromhex("b814000000" "cd80" "c3")  # mov eax, 20 (i386 getpid); int 0x80; ret
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    threading.Thread(target=fn, daemon=True).start()
    time.sleep(0.5)
    print("survived", flush=True)
    os._exit(0)  # a thread killed alone would block interpreter shutdown
""")


@needs_bwrap
@x86_64_only
def test_i386_syscall_from_a_thread_kills_the_whole_process():
    done = _bwrap([PY, "-c", I386_FROM_THREAD])
    assert "survived" not in done.stdout  # KILL_PROCESS, not libseccomp's default KILL_THREAD
    assert done.returncode == 128 + signal.SIGSYS, (done.returncode, done.stderr)
