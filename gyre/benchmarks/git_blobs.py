"""Find a file by its sha256 among every blob of a repository's history.

Grading bundles that carry hidden tests as (path, sha256) only (RepoHarness's R2E bundles) can be rebuilt only
where the very bytes are somewhere in the project's history: R2E-Gym copied its hidden tests from the fix commit's
test files, under other names (`test_1.py`, `helper.py`), so a path lookup cannot find them, a content hash can.
`BlobIndex.of(repo)` hashes each blob once (`git cat-file --batch-all-objects`, then `--batch`); a repository of
130,000 blobs takes seconds.
"""

from __future__ import annotations

import hashlib
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

MAX_BLOB_BYTES = 8_000_000
"""Blobs above this are not hashed (no test file is that large; keeps memory bounded)."""
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
EMPTY_BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
"""An empty file (R2E-Gym's `r2e_tests/__init__.py`): its bytes are known without any history."""
_GIT_ENV = {"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


@dataclass(frozen=True)
class BlobIndex:
    """sha256 (hex) of a blob's bytes -> its git object id, for every blob in `repo`."""

    repo: Path
    by_sha256: dict[str, str]

    @classmethod
    def of(cls, repo: Path) -> BlobIndex:
        listed = _git(repo, "cat-file", "--batch-all-objects", "--batch-check=%(objecttype) %(objectname) "
                      "%(objectsize)").stdout.decode().splitlines()
        blobs = [parts[1] for parts in (line.split() for line in listed)
                 if parts and parts[0] == "blob" and int(parts[2]) <= MAX_BLOB_BYTES]
        return cls(Path(repo), _hash_blobs(repo, blobs))

    def find(self, sha256: str) -> str | None:
        """The git blob id whose bytes have this sha256 (`sha256:` prefix allowed), or None."""
        digest = sha256.removeprefix("sha256:").lower()
        return EMPTY_BLOB if digest == EMPTY_SHA256 else self.by_sha256.get(digest)

    def read(self, blob: str) -> bytes:
        if blob == EMPTY_BLOB:
            return b""
        return _git(self.repo, "cat-file", "blob", blob).stdout


def has_commit(repo: Path, commit: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"], env=_GIT_ENV,
                          capture_output=True, timeout=60).returncode == 0


def _hash_blobs(repo: Path, blobs: list[str]) -> dict[str, str]:
    proc = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=_GIT_ENV)

    def feed() -> None:
        for blob in blobs:
            proc.stdin.write(f"{blob}\n".encode())
        proc.stdin.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    found: dict[str, str] = {}
    for _ in blobs:
        header = proc.stdout.readline().split()
        if len(header) != 3:
            raise RuntimeError(f"git cat-file --batch in {repo}: unexpected header {header!r}")
        data = proc.stdout.read(int(header[2]))
        proc.stdout.read(1)  # the newline after each object
        found.setdefault(hashlib.sha256(data).hexdigest(), header[0].decode())
    feeder.join()
    if proc.wait() != 0:
        raise RuntimeError(f"git cat-file --batch in {repo} exited {proc.returncode}")
    return found


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], env=_GIT_ENV, capture_output=True, check=True,
                          timeout=600)
