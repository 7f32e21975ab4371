"""Flag workspace files that are byte-for-byte copies of files installed on this machine.

NL2RepoBench asks an agent to write a public package (six, tqdm, pytz...). The evaluation
never sees gyre's own packages and the index proxy refuses the project's own
distribution, but the agent's sandbox can still read the interpreter gyre runs (its
harnesses live there), so an agent can copy `six.py` into its workspace and score full
marks without writing anything. This check hashes each `*.py` file of a kept workspace
and looks it up among the sha256 hashes that installed distributions record in their
`RECORD` files (no installed file is read, only the RECORDs), so a verbatim copy is
named with its source ("six 1.17.0: six.py"). Files under `MIN_BYTES` are skipped: empty
`__init__.py` files and one-liners are the same everywhere.

What it cannot see: a copy that was edited (even one byte), reformatted or renamed into
other code, and files of packages installed elsewhere.

The index (`installed_hashes`, about 17,000 files in gyre's environment) is read from the
RECORD files' text directly (building importlib's `PackagePath` objects for every entry took
~1 s) and kept for the process, keyed on the environment: every `sys.path` entry with its
modification time, which changes when a distribution is installed, upgraded or removed.
A distribution's name and version are read only for the files a workspace actually copied.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath

CHECK = "copied-installed-file"
MIN_BYTES = 512
MAX_FILE_BYTES = 4_000_000
MAX_FILES = 20_000


@dataclass(frozen=True)
class Copy:
    path: str
    """Relative posix path in the workspace."""
    source: str
    """`<distribution> <version>: <file>` it is a copy of."""


class _Source:
    """Where an installed file comes from; named only when a workspace file matches it."""

    __slots__ = ("dist", "path")

    def __init__(self, dist: metadata.Distribution, path: str) -> None:
        self.dist, self.path = dist, path

    def __str__(self) -> str:
        return f"{self.dist.metadata['Name']} {self.dist.version}: {PurePosixPath(self.path)}"


_index_lock = threading.Lock()
_index: tuple[tuple, dict[str, _Source]] | None = None


def environment_key() -> tuple:
    """What the installed distributions depend on: each `sys.path` entry and its mtime (None: missing)."""
    key = []
    for entry in sys.path:
        try:
            key.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            key.append((entry, None))
    return tuple(key)


def installed_hashes() -> dict[str, _Source]:
    """sha256 (RECORD's urlsafe base64, unpadded) of every installed `*.py` file -> where it comes from
    (`str()` of it: `<distribution> <version>: <file>`); rebuilt when `environment_key()` changes."""
    global _index
    key = environment_key()
    with _index_lock:
        if _index is None or _index[0] != key:
            _index = (key, build_index())
        return _index[1]


def build_index() -> dict[str, _Source]:
    """The index of `installed_hashes`, read from every distribution's RECORD (the first one listing a hash wins)."""
    found: dict[str, _Source] = {}
    for dist in metadata.distributions():
        text = dist.read_text("RECORD")  # an egg-info's file list records no hashes: nothing to index
        for row in csv.reader(text.splitlines() if text else ()):
            path, digest, size = (row + ["", ""])[:3]
            mode, _, value = digest.partition("=")
            if mode == "sha256" and value and path.endswith(".py") and size.isdigit() and int(size) >= MIN_BYTES:
                found.setdefault(value, _Source(dist, path))
    return found


def copied_files(workspace: Path) -> list[Copy]:
    """Workspace `*.py` files identical to an installed one (symlinks never followed, `.git` skipped)."""
    known = installed_hashes()
    copies: list[Copy] = []
    pending, seen = [Path(workspace)], 0
    while pending and seen < MAX_FILES:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if entry.is_dir(follow_symlinks=False):
                if entry.name != ".git":
                    pending.append(Path(entry.path))
            elif entry.name.endswith(".py") and entry.is_file(follow_symlinks=False):
                digest = _digest(entry)
                if digest in known:
                    rel = Path(entry.path).relative_to(workspace).as_posix()
                    copies.append(Copy(rel, str(known[digest])))
    return sorted(copies, key=lambda c: c.path)


def copy_of(data: bytes, known: Mapping[str, object]) -> str | None:
    """What the file whose bytes are `data` is a copy of (`<distribution> <version>: <file>`), given `known`
    (`installed_hashes`); None if it is no copy (or too small to tell)."""
    if not MIN_BYTES <= len(data) <= MAX_FILE_BYTES:
        return None
    source = known.get(base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode())
    return None if source is None else str(source)


def _digest(entry: os.DirEntry) -> str | None:
    try:
        size = entry.stat(follow_symlinks=False).st_size
        if not MIN_BYTES <= size <= MAX_FILE_BYTES:
            return None
        with open(entry.path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
