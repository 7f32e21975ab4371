"""The bubblewrap command line that confines one sandboxed command.

bubblewrap (`bwrap`, apt package `bubblewrap`) builds a fresh set of Linux namespaces per
command; this module only builds its argv (pure, unit-tested), `gyre.sandboxes.local.isolation`
runs it. What the command then sees:

- Namespaces: user (it runs as uid/gid 1000, mapped to gyre's own user outside, or to
  the unprivileged uid 65534 when gyre is root, with no capabilities), PID (it is alone; when it exits or is killed, the kernel kills every
  process left in the namespace, `setsid()` or not), network (only a loopback interface:
  the host's 127.0.0.1 and the internet are unreachable), IPC, UTS, cgroup.
- Filesystem: the root is empty; `/usr /bin /sbin /lib* /etc` and the Python installation
  running gyre (venv and base prefix) are bound read-only. Host secrets in `/etc`
  (`shadow`, `gshadow`, `sudoers*`, `ssh/`, `ssl/private/`) are masked. Nothing else of the
  host exists inside: not `/root` or `/home`, not the run directory, not other
  executions' workspaces, not the benchmark's hidden tests.
- Writable: only the workspace (at its host path or at `SandboxLayout.workdir`, e.g.
  `/app`), a per-sandbox scratch directory at `/tmp`, and the layout's writable mounts.
- `/proc` is the namespace's own, with the parts that change host state read-only
  (`/proc/sys`, `/proc/sysrq-trigger`, `/proc/irq`, `/proc/bus`, `/proc/fs`: bound from
  the host read-only, so host sysctl values can be read, never written). `/dev` is a
  minimal read-only one (null, zero, random, tty); `/dev/shm` is a directory of the
  scratch space, so shared memory counts against the disk limit like `/tmp`; the tmpfs
  masking host secrets and the root tmpfs are read-only. No writable tmpfs exists, so
  nothing writable escapes the disk limit.
- No new user namespaces (`--disable-userns`), and the seccomp filter of
  `gyre.sandboxes.local.seccomp` when the caller passes one (`seccomp_fd`).
- `--die-with-parent`: if gyre dies, the sandbox dies with it.
- When gyre runs as root, the caller has already dropped to an unprivileged host uid
  (`gyre.sandboxes.local.privileges`) and passes `source` to bind staged copies of the paths.

Background processes live as long as the command that started them: each `exec` is its
own PID and network namespace (a `gyre.sandboxes.local.session` keeps one sandbox for many
commands instead). State that must outlive a command goes in the workspace. The root
itself is read-only once every mount point exists; missing parents of mount points are
made 0755 (bubblewrap's default 0700 would lock out a session's other uid).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from gyre.sandboxes.layout import SandboxLayout

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
MASKED_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")
MASKED_DIRS = ("/etc/ssh", "/etc/ssl/private", "/etc/sudoers.d")
READ_ONLY_PROC = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
SHM_DIR = ".shm"
"""Subdirectory of the scratch space shown as `/dev/shm`."""
SANDBOX_UID = 1000
SANDBOX_GID = 1000
HOSTNAME = "gyre-sandbox"


def find_bwrap() -> str | None:
    """Path of a working `bwrap`, or None."""
    return shutil.which("bwrap")


def python_prefixes() -> list[Path]:
    """Directories the interpreter running gyre needs (venv, base installation), deduplicated."""
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    candidates.append(str(Path(os.path.realpath(sys.executable)).parent.parent))
    return _outside_system_dirs(Path(c) for c in candidates)


def bwrap_argv(
    bwrap: str,
    *,
    workspace: Path,
    scratch: Path,
    layout: SandboxLayout,
    extra_ro: Iterable[Path] = (),
    source: Callable[[Path], Path] = lambda path: path,
    seccomp_fd: int | None = None,
    python_dirs: Iterable[Path] | None = None,
) -> list[str]:
    """argv prefix (ends with `--`) that runs the following command confined as the module docstring says.

    `source(host_path)` is what bubblewrap binds for each non-system host path (a staged
    path when it runs unprivileged); `scratch/.shm` must exist (`prepare_scratch`).
    `python_dirs` replaces the interpreter directories bound (default: gyre's own, `python_prefixes`).
    """
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--uid", str(SANDBOX_UID),
        "--gid", str(SANDBOX_GID),
        "--hostname", HOSTNAME,
        "--die-with-parent",
        "--cap-drop", "ALL",
        "--disable-userns",
    ]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += [arg for path in MASKED_FILES if os.path.exists(path) for arg in ("--ro-bind", "/dev/null", path)]
    argv += [arg for path in MASKED_DIRS if os.path.isdir(path) for arg in ("--tmpfs", path, "--remount-ro", path)]
    argv += ["--proc", "/proc"]
    argv += [arg for path in READ_ONLY_PROC if os.path.exists(path) for arg in ("--ro-bind", path, path)]
    argv += ["--dev", "/dev", "--bind", str(source(scratch / SHM_DIR)), "/dev/shm", "--remount-ro", "/dev"]
    # /tmp first: the Python installation may live under /tmp (a CI clone's venv), and a
    # later mount on /tmp would hide it.
    argv += ["--bind", str(source(scratch)), "/tmp"]
    for path in _outside_system_dirs([*(python_prefixes() if python_dirs is None else python_dirs), *extra_ro]):
        argv += ["--ro-bind", str(source(path)), str(path)]
    inside = layout.inside(workspace)
    argv += _parents([inside, *(m.target for m in layout.mounts)])
    argv += ["--bind", str(source(workspace)), inside]
    for mount in layout.mounts:
        argv += ["--bind" if mount.writable else "--ro-bind", str(source(Path(mount.source))), mount.target]
    argv += ["--remount-ro", "/", "--chdir", inside, "--"]  # the root tmpfs: no writable memory outside the limits
    return argv


def _parents(targets: Iterable[str]) -> list[str]:
    """`--dir` (mode 0755) for the missing ancestors of mount targets: bubblewrap would make them 0700,
    owned by whoever starts it, which a session's commands (another uid) could not traverse."""
    existing = ("/tmp", "/proc", "/dev", *SYSTEM_DIRS)
    argv: list[str] = []
    seen: set[str] = set()
    for target in targets:
        for parent in reversed(Path(target).parents):
            name = str(parent)
            if name == "/" or name in seen or any(name == e or name.startswith(e + "/") for e in existing):
                continue
            seen.add(name)
            argv += ["--perms", "0755", "--dir", name]
    return argv


def bound_sources(workspace: Path, scratch: Path, layout: SandboxLayout, extra_ro: Iterable[Path] = (),
                  python_dirs: Iterable[Path] | None = None) -> list[Path]:
    """Every non-system host path `bwrap_argv` binds (what an unprivileged bubblewrap needs staged)."""
    dirs = _outside_system_dirs([*(python_prefixes() if python_dirs is None else python_dirs), *extra_ro])
    return [scratch / SHM_DIR, scratch, *dirs, workspace, *(Path(m.source) for m in layout.mounts)]


def prepare_scratch(scratch: Path) -> None:
    """Create the scratch directory and its `/dev/shm` part, which must be a plain directory.

    The scratch space is the sandbox's `/tmp`: a command can replace `/tmp/.shm` with a symlink
    to any host directory, and binding it as the next command's `/dev/shm` would follow the link
    (as root when staged). So anything but a directory there is removed first; a sandbox's
    commands run one after the other and none outlives its command, so nothing swaps it back
    before the bind (and the staging prelude refuses a symlinked source anyway).
    """
    shm = scratch / SHM_DIR
    scratch.mkdir(parents=True, exist_ok=True)
    if shm.is_symlink() or (shm.exists() and not shm.is_dir()):
        shm.unlink()
    shm.mkdir(exist_ok=True)


def _outside_system_dirs(paths: Iterable[Path]) -> list[Path]:
    """Existing `paths`, resolved, minus those already visible through a system dir or another entry."""
    kept: list[Path] = []
    for path in sorted({Path(os.path.realpath(p)) for p in paths if os.path.exists(p)}, key=lambda p: len(p.parts)):
        covered = [Path(d) for d in SYSTEM_DIRS if not os.path.islink(d)] + kept
        if not any(path == c or path.is_relative_to(c) for c in covered):
            kept.append(path)
    return kept
