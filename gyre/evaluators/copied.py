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
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

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


@lru_cache(maxsize=1)
def installed_hashes() -> dict[str, str]:
    """sha256 (RECORD's urlsafe base64, unpadded) of every installed `*.py` file -> where it comes from."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = f"{dist.metadata['Name']} {dist.version}"
        for record in dist.files or ():
            if record.hash is not None and record.hash.mode == "sha256" and record.name.endswith(".py") \
                    and (record.size or 0) >= MIN_BYTES:
                found.setdefault(record.hash.value, f"{name}: {record}")
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
                    copies.append(Copy(rel, known[digest]))
    return sorted(copies, key=lambda c: c.path)


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
