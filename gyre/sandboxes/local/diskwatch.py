"""Bound the disk a command may fill, without disk quotas: poll the writable directories.

RLIMIT_FSIZE caps each file, but a loop writing many capped files still fills the disk,
and neither bubblewrap nor a plain process has a per-directory quota. `DiskWatch` walks
the sandbox's writable directories (workspace, scratch) at most every `interval_s`
while a command runs; once they hold more than `max_bytes` (apparent size: what a later
copy would cost) or more than `max_files` entries, it returns a reason and the runner
kills the command (`ExecResult.limit_hit`). The walk stops counting as soon as a limit
is passed, so a million-file workspace costs one bounded walk. Overshoot is bounded by
write speed x interval; pick `max_bytes` with that margin below the free disk.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_INTERVAL_S = 0.25


@dataclass(frozen=True)
class DiskUsage:
    num_bytes: int
    num_files: int
    max_depth: int = 0
    """Deepest directory level seen below a root (a root's own entries are level 1)."""


def disk_usage(roots: Sequence[Path], max_bytes: int | None = None, max_files: int | None = None) -> DiskUsage:
    """Apparent bytes, entry count and depth under `roots` (symlinks not followed); stops early past a limit."""
    num_bytes = 0
    num_files = 0
    max_depth = 0
    stack = [(str(r), 1) for r in roots if os.path.isdir(r)]
    while stack:
        directory, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        max_depth = max(max_depth, depth if entries else depth - 1)
        for entry in entries:
            num_files += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, depth + 1))
                else:
                    num_bytes += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
        if (max_bytes is not None and num_bytes > max_bytes) or (max_files is not None and num_files > max_files):
            break
    return DiskUsage(num_bytes, num_files, max_depth)


@dataclass
class DiskWatch:
    """A `watch` callable for `run_command`: None while within limits, else the reason."""

    roots: Sequence[Path]
    max_bytes: int
    max_files: int
    interval_s: float = DEFAULT_INTERVAL_S
    _next_check: float = field(default=0.0, init=False)

    def __call__(self) -> str | None:
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + self.interval_s
        usage = disk_usage(self.roots, self.max_bytes, self.max_files)
        if usage.num_bytes > self.max_bytes:
            return f"disk limit: writable directories hold more than {self.max_bytes} bytes"
        if usage.num_files > self.max_files:
            return f"file-count limit: writable directories hold more than {self.max_files} entries"
        return None
