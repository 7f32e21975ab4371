"""Resolve a workspace-relative path, refusing anything that lands outside the workspace.

The agent controls the workspace's contents, including symlinks, and the host side
(harness adapters, evaluators) reads and writes files there by relative path. Every such
access goes through `resolve_inside`, so `../../etc/passwd`, `/etc/passwd` and a symlink
the agent pointed at the host all fail with a ValueError naming the path, instead of
touching a file outside the workspace.

Host-side code that must put a file of its own at a fixed place in a tree the agent
wrote (the evaluator's hidden tests, its pytest.ini) uses `clear_path`: whatever stands in
the way, symlinks included, is removed rather than followed.

Known gap: this checks at call time; a process inside the sandbox could swap a
directory for a symlink between the check and the use. Mount namespaces close that later.
"""

from __future__ import annotations

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


def read_inside(root: Path, rel: str) -> str:
    """The text of `rel` inside `root` (refused if it resolves outside)."""
    return resolve_inside(root, rel).read_text(encoding="utf-8")


def write_inside(root: Path, rel: str, content: str) -> Path:
    """Write `content` to `rel` inside `root`, creating parent directories (refused outside); the path written."""
    target = resolve_inside(root, rel)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content, encoding="utf-8")
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
