"""A seccomp filter that denies the system calls a sandboxed agent never needs.

Why: bubblewrap's namespaces already confine what an agent's command sees, but every
system call still reaches the host kernel. A kernel bug reachable through a rarely used
call (new mount API, keyrings, BPF, user namespaces, ...) is a way out of the sandbox, and
none of those calls has a use in building, testing or editing code. This module compiles a
deny-list filter with libseccomp (through `pyseccomp`, ctypes over `libseccomp.so.2`) into
the classic-BPF program that `bwrap --seccomp FD` reads from a file descriptor and loads
just before it executes the command. The filter is inherited by every process the command
starts and cannot be removed.

What is denied (everything else is allowed):

- `DENIED_SYSCALLS` fail with EPERM, as an unprivileged caller would see:
  - mounts and the root directory: mount, umount2, pivot_root, chroot and the new mount
    API (move_mount, open_tree, fsopen, fsconfig, fsmount, fspick, mount_setattr);
  - namespaces: unshare, setns (new user namespaces are the usual first step of kernel
    exploits: they hand out capabilities over fresh namespaces);
  - kernel keyrings: keyctl, add_key, request_key (not namespaced);
  - other processes' memory: ptrace, process_vm_readv, process_vm_writev;
  - kernel code: init_module, finit_module, delete_module, bpf, perf_event_open,
    kexec_load, kexec_file_load;
  - host-wide state: reboot, swapon, swapoff, syslog, acct, settimeofday, clock_settime,
    clock_adjtime, adjtimex, quotactl, vhangup;
  - file handles (open_by_handle_at can open files outside a bind mount), userfaultfd
    (a classic exploit primitive for stalling the kernel mid-copy), iopl/ioperm (raw I/O
    ports), lookup_dcookie.
  Names libseccomp does not know for the native architecture are skipped
  (`unresolved_syscalls()` lists them; on x86_64 with libseccomp 2.5 there are none).
- `clone` whose flags (argument 0) carry any `CLONE_NAMESPACE_FLAGS` bit fails with EPERM;
  plain `fork`, threads, `vfork`/`posix_spawn` are untouched. CLONE_NEWTIME is not in that
  set: `clone` cannot express it (its low byte is the exit signal); only `clone3` and
  `unshare` can, and both are denied.
- `ENOSYS_SYSCALLS` (`clone3`) fail with ENOSYS: seccomp cannot read the flags behind
  clone3's pointer argument, and ENOSYS makes glibc (2.34+) fall back to `clone`, whose flags the filter
  can check (Docker's default profile does the same).
- Other architectures: any call made with a different syscall ABI than the native one
  (on x86_64: i386 via `int 0x80`, and x32, i.e. numbers with bit 0x40000000) kills the
  whole process with SIGSYS. libseccomp's own default bad-arch action is KILL (=
  SECCOMP_RET_KILL_THREAD, only the calling thread dies); it is set to KILL_PROCESS here.
  Without this an i386 call would bypass every rule above, since the numbers differ.

What is NOT covered: this is a deny-list, not an allow-list. Not denied: io_uring
(io_uring_setup/enter/register), personality, kcmp, pidfd_open/pidfd_getfd/pidfd_send_signal,
memfd_create, socket families such as AF_NETLINK or AF_PACKET (the network namespace is
what confines networking), ioctl requests (e.g. TIOCSTI), prctl, seccomp itself (a filter
can only add restrictions), mknod (left to capabilities and mount options). Arguments are
checked only for `clone`; nothing here limits resources (cgroups do) or files (mounts do).
The filter is compiled for the native architecture only (`clone`'s flags are read from
argument 0, or argument 1 on s390/s390x where the kernel swaps the first two).
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile

# Calls that fail with EPERM whatever their arguments.
MOUNT_SYSCALLS = (
    "mount", "umount2", "pivot_root", "chroot",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
)
NAMESPACE_SYSCALLS = ("unshare", "setns")
KEYRING_SYSCALLS = ("keyctl", "add_key", "request_key")
PROCESS_MEMORY_SYSCALLS = ("ptrace", "process_vm_readv", "process_vm_writev")
KERNEL_CODE_SYSCALLS = (
    "init_module", "finit_module", "delete_module", "bpf", "perf_event_open",
    "kexec_load", "kexec_file_load",
)
HOST_STATE_SYSCALLS = (
    "reboot", "swapon", "swapoff", "syslog", "acct", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "quotactl", "vhangup",
)
MISC_SYSCALLS = (
    "open_by_handle_at", "name_to_handle_at", "userfaultfd", "iopl", "ioperm", "lookup_dcookie",
)
DENIED_SYSCALLS: tuple[str, ...] = (
    MOUNT_SYSCALLS + NAMESPACE_SYSCALLS + KEYRING_SYSCALLS + PROCESS_MEMORY_SYSCALLS
    + KERNEL_CODE_SYSCALLS + HOST_STATE_SYSCALLS + MISC_SYSCALLS
)

# Calls that fail with ENOSYS, so that libc falls back to a call the filter can inspect.
ENOSYS_SYSCALLS: tuple[str, ...] = ("clone3",)

# clone(2) flag bits that create namespaces; any of them set in clone's flags -> EPERM.
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NAMESPACE_FLAGS: tuple[int, ...] = (
    CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET,
)


def _native_number(name: str) -> int:
    """The native syscall number of `name`, negative if libseccomp does not know it here."""
    import pyseccomp

    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)


def unresolved_syscalls() -> tuple[str, ...]:
    """Names in DENIED_SYSCALLS/ENOSYS_SYSCALLS that the native architecture lacks (skipped by the filter)."""
    return tuple(name for name in (*DENIED_SYSCALLS, *ENOSYS_SYSCALLS) if _native_number(name) < 0)


def seccomp_fd() -> int:
    """A pipe's read end holding the compiled filter (bubblewrap's `--seccomp FD`, or the session's
    loader, reads it once); the caller closes it."""
    read, write = os.pipe()
    try:
        os.write(write, seccomp_bpf())
    finally:
        os.close(write)
    return read


@functools.cache
def seccomp_bpf() -> bytes:
    """The compiled classic-BPF filter for the native architecture, as `bwrap --seccomp FD` reads it.

    Raises RuntimeError if libseccomp cannot be loaded (pyseccomp raises it on import).
    """
    import pyseccomp

    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    flt.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
    for name in DENIED_SYSCALLS:
        number = _native_number(name)
        if number >= 0:
            flt.add_rule(pyseccomp.ERRNO(errno.EPERM), number)
    for name in ENOSYS_SYSCALLS:
        number = _native_number(name)
        if number >= 0:
            flt.add_rule(pyseccomp.ERRNO(errno.ENOSYS), number)
    clone = _native_number("clone")
    flags_arg = 1 if pyseccomp.system_arch() in (pyseccomp.Arch.S390, pyseccomp.Arch.S390X) else 0
    for flag in CLONE_NAMESPACE_FLAGS:
        flt.add_rule(pyseccomp.ERRNO(errno.EPERM), clone, pyseccomp.Arg(flags_arg, pyseccomp.MASKED_EQ, flag, flag))
    with tempfile.TemporaryFile() as out:
        flt.export_bpf(out)
        out.seek(0)
        return out.read()
