"""Walk a tree the agent wrote without ever following a link: each entry opened relative to its parent's fd.

gyre runs as root; the agent controls its workspace and may leave processes running that swap
a directory for a symlink to a host path while gyre works on the tree (seen: an ACL grant that
made a root-owned host file world-writable, 3 runs of 3). A path-based walk (`os.walk`,
`setxattr(path)`, `chmod(path)`) checks a name and then uses it: the swap wins the gap. Here
every directory is opened with `O_NOFOLLOW | O_DIRECTORY` relative to the fd of its parent
and every file with `O_NOFOLLOW | O_NONBLOCK`, and the callbacks act on those fds only
(`fsetxattr`, `fchmod`, `fchown`): a link is never followed, a swapped entry fails to open
and is skipped, and a directory moved elsewhere meanwhile is still the agent's own (it can
only move it inside what it may write). FIFOs, sockets and devices are never opened.

A directory deeper than `MAX_DEPTH` is not entered (one fd stays open per level), and `walk`
says how many were left out. Callers still do their root work only once the agent's processes
are frozen or dead (`gyre.sandboxes.local.freeze`), so nothing changes under them at all.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

MAX_DEPTH = 256
"""Directory levels walked below the root; deeper directories are left out (and counted)."""
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_GONE = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EACCES, errno.ENXIO)
"""A name that vanished, became a link or stopped being a directory between listing and open."""

OnEntry = Callable[[int, os.stat_result], None]
OnFileAt = Callable[[str, int, os.stat_result], None]


def walk(root: Path, on_dir: OnEntry | None = None, on_file: OnEntry | None = None,
         on_file_at: OnFileAt | None = None) -> int:
    """Call `on_dir(fd, stat)` for `root` and each directory below it and `on_file(fd, stat)` for each
    regular file (`on_file_at(rel, fd, stat)` with its path under `root`, "/"-separated), never through a link;
    returns how many directories were too deep to enter."""
    try:
        fd = os.open(root, DIR_FLAGS)
    except OSError as exc:
        if exc.errno in _GONE:
            return 0
        raise
    too_deep = 0
    stack: list[tuple[int, list[str], str]] = []
    try:
        _visit_dir(fd, on_dir)
        stack.append((fd, os.listdir(fd), ""))
        while stack:
            parent, names, prefix = stack[-1]
            if not names:
                os.close(stack.pop()[0])
                continue
            name = names.pop()
            child, kind = _open_entry(parent, name)
            if child is None:
                continue
            if kind == "file":
                try:
                    if on_file is not None:
                        on_file(child, os.fstat(child))
                    if on_file_at is not None:
                        on_file_at(prefix + name, child, os.fstat(child))
                finally:
                    os.close(child)
            elif len(stack) > MAX_DEPTH:
                os.close(child)
                too_deep += 1
            else:
                _visit_dir(child, on_dir)
                stack.append((child, os.listdir(child), f"{prefix}{name}/"))
    finally:
        for open_fd, _, _ in stack:
            os.close(open_fd)
    return too_deep


def _visit_dir(fd: int, on_dir: OnEntry | None) -> None:
    if on_dir is not None:
        on_dir(fd, os.fstat(fd))


def _open_entry(parent: int, name: str) -> tuple[int | None, str]:
    """`name` under `parent` opened without following it: (fd, "dir" | "file"), or (None, "") for a
    link, a special file or an entry gone meanwhile."""
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            return os.open(name, DIR_FLAGS, dir_fd=parent), "dir"
        if not stat.S_ISREG(mode):
            return None, ""
        fd = os.open(name, FILE_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in _GONE:
            return None, ""
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a FIFO or a device between stat and open
        os.close(fd)
        return None, ""
    return fd, "file"


def strip_special_bits(root: Path) -> int:
    """Clear setuid, setgid and sticky bits under `root` (files and directories, never through a link):
    nothing the agent marked setuid stays runnable as its user on the host. Returns how many changed."""
    changed = 0

    def clear(fd: int, st: os.stat_result) -> None:
        nonlocal changed
        if st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o777)
            changed += 1

    walk(root, on_dir=clear, on_file=clear)
    return changed


def read_regular(root: Path, rel: str, limit: int) -> bytes | None:
    """The bytes of the regular file `rel` under `root`, reached one component at a time without following
    a link; None when a component is a link, the entry is not a regular file, is gone, or holds more than
    `limit` bytes. Safe as root on a tree the agent can still change."""
    parts = [p for p in Path(rel).parts if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    try:
        fd = os.open(root, DIR_FLAGS)
    except OSError as exc:
        if exc.errno in _GONE:
            return None
        raise
    try:
        for name in parts[:-1]:
            child, kind = _open_entry(fd, name)
            os.close(fd)
            fd = child
            if fd is None or kind != "dir":
                return None
        file_fd, kind = _open_entry(fd, parts[-1])
        if file_fd is not None and kind != "file":
            os.close(file_fd)
        if file_fd is None or kind != "file":
            return None
        with os.fdopen(file_fd, "rb") as handle:
            data = handle.read(limit + 1)
        return data if len(data) <= limit else None
    finally:
        if fd is not None:
            os.close(fd)
