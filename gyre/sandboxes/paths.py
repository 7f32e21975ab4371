"""Workspace-relative paths on the host side: checked, cleared, removed, never followed out of the workspace.

`resolve_inside` says where a relative path lands, refusing `../../etc/passwd`, `/etc/passwd`
and a symlink the agent pointed at the host with a ValueError naming the path. It is a check
at call time only: a process the agent left running could swap a directory for a symlink
right after it. So nothing reads or writes agent files by a path it checked: the harness's file
tools run inside the sandbox (`gyre.sandboxes.file_tools`; this check only makes their error
clear), and root work on a tree the agent wrote goes through `gyre.sandboxes.fdwalk`.

Host-side code that must put a file of its own at a fixed place in a tree the agent
wrote (the evaluator's hidden tests on its fresh copy, before any of its commands runs)
uses `clear_path`: whatever stands in the way, symlinks included, is removed rather than
followed. `remove_tree` deletes a tree without following a link, once nothing runs in it.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path, PurePosixPath


def resolve_inside(root: Path, rel: str) -> Path:
    """The absolute path of `rel` under `root`, with every symlink resolved; ValueError if outside."""
    root = Path(root).resolve()
    rel_path = PurePosixPath(rel)
    if not rel or rel_path.is_absolute() or ".." in rel_path.parts:
        raise ValueError(f"path {rel!r} must be relative to the workspace {root} and must not contain '..'")
    target = (root / rel_path).resolve()
    if target != root and not target.is_relative_to(root):
        raise ValueError(f"path {rel!r} resolves to {target}, outside the workspace {root} (through a symlink)")
    return target


def clear_path(root: Path, rel: str) -> Path:
    """Make `root/rel` a free spot for a new file; symlinks and files in the way are removed, never followed."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
        raise ValueError(f"path {rel!r} must be relative to {root} and must not contain '..'")
    current = Path(root)
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            current.unlink()
        current.mkdir(exist_ok=True)
    target = current / parts[-1]
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.is_symlink() or target.exists():
        target.unlink()
    return target


def remove_tree(root: Path) -> None:
    """Delete `root` and everything under it without recursion (an agent can nest directories
    deeper than `shutil.rmtree` can recurse); symlinks are removed, never followed; gone is fine."""
    root = Path(root)
    if root.is_symlink() or root.is_file():
        root.unlink(missing_ok=True)
        return
    pending, emptied = [str(root)], []
    while pending:
        directory = pending.pop()
        emptied.append(directory)
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            else:
                os.unlink(entry.path)
    for directory in reversed(emptied):
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass


def clear_xattrs(path: Path) -> None:
    """Remove `path`'s own `user.` extended attributes, the namespace an unprivileged owner may set (not followed
    through a link); nothing on a filesystem without them."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return
        raise
    for name in (n for n in names if n.startswith("user.")):
        os.removexattr(path, name, follow_symlinks=False)
