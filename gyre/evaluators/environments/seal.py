"""The evaluation environment sealed before the workspace's commands: what they plant in it is tampering.

A setup command (`pip install -e .`, `python setup.py develop`) runs the workspace's own code with
write access to the evaluation's environment (`toolenv`: pip installs the project into it). That
code can plant what runs in every later Python process before any of gyre's code: a `.pth` file
with an `import` line (site runs it at start-up, before gyre's `sitecustomize` and its runtime
monitor), a `sitecustomize.py` or `usercustomize.py`, a patched `pytest` in site-packages, a
forged bytecode file (commands run with PYTHONDONTWRITEBYTECODE, so no Python process writes one).

`EnvSeal.take` records every file of the environment (never through a link: `fdwalk`) before the
first command; `broken` compares after each one. A file that is new or changed is the installer's
when a distribution's `RECORD` that is itself new or changed lists it (pip installing the project
and what it needs); anything else is tampering. A new or changed `sitecustomize.py`/
`usercustomize.py`, or a `.pth` with an `import` line other than setuptools' own editable finder
(`import __editable___<name>_finder; ...install()`), is tampering unless it belongs to a
distribution pip took from the package index (no `direct_url.json` beside its `RECORD`: coverage's
`a1_coverage.pth`, which more-itertools' test dependencies bring); one built from a local
directory (the workspace's own project) never counts as the installer's. A `.pth` of paths only
(`easy-install.pth`, an editable install's path file) adds directories to the end of `sys.path` and
runs nothing. A file removed is the installer's when its distribution's `RECORD` went too (pip
replacing a version). Identity is (inode, size, mtime, ctime): ctime cannot be set from user
space, so rewriting a file in place is seen.

Blind spots: a distribution the workspace builds may list its own `.pth`-loaded editable finder in
its `RECORD` in setuptools' shape, and a setup command that writes a whole `dist-info` by hand
(no `direct_url.json`) passes for an index install; the runtime monitor still watches what that
code does later.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from gyre.sandboxes.fdwalk import walk

STARTUP_FILES = ("sitecustomize.py", "usercustomize.py")
EDITABLE_FINDER = re.compile(r"^import (__editable___[\w.]+_finder); \1\.install\([^;]*\)$")
MAX_READ_BYTES = 1 << 20
"""`.pth` and `RECORD` files are read up to this size; a larger `.pth` is tampering on its face."""

Identity = tuple[int, int, int, int]


@dataclass
class _Listing:
    files: dict[str, Identity]
    texts: dict[str, str]
    """`.pth`, `RECORD` and start-up files' contents (decoded, replaced), by path."""


def _list(root: Path) -> _Listing:
    listing = _Listing({}, {})

    def seen(rel: str, fd: int, st: os.stat_result) -> None:
        listing.files[rel] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        name = posixpath.basename(rel)
        if name.endswith(".pth") or name in STARTUP_FILES or (name == "RECORD" and rel.endswith(".dist-info/RECORD")):
            data = os.pread(fd, MAX_READ_BYTES + 1, 0)
            listing.texts[rel] = data.decode("utf-8", "replace") if len(data) <= MAX_READ_BYTES else "\0too large"

    walk(root, on_file_at=seen)
    return listing


def _recorded(rel: str, text: str) -> set[str]:
    """The files a `RECORD` at `rel` lists, as paths under the environment's root."""
    site = posixpath.dirname(posixpath.dirname(rel))
    listed = set()
    for line in text.splitlines():
        path = line.rsplit(",", 2)[0].strip().strip('"')
        if path:
            listed.add(posixpath.normpath(posixpath.join(site, path)))
    return listed


def _runs_code(text: str) -> str | None:
    """The first line of a `.pth` that site would execute (other than setuptools' editable finder), or None."""
    if text.startswith("\0too large"):
        return "(over 1 MiB)"
    for line in text.splitlines():
        if line.startswith(("import ", "import\t")) and not EDITABLE_FINDER.match(line.strip()):
            return line[:120]
    return None


@dataclass
class EnvSeal:
    root: Path
    before: _Listing

    @classmethod
    def take(cls, root: Path) -> EnvSeal:
        """The environment at `root` now, before any workspace code ran in it."""
        return cls(Path(root), _list(Path(root)))

    def broken(self) -> list[str]:
        """Tampering evidence: what changed in the environment since `take` that no installer wrote (see the module
        docstring); empty when nothing did."""
        now = _list(self.root)
        old, new = self.before.files, now.files
        changed = sorted(rel for rel, ident in new.items() if old.get(rel) != ident)
        removed = sorted(set(old) - set(new))
        records = [rel for rel in changed if rel.endswith(".dist-info/RECORD")]
        installed = set().union(*(_recorded(rel, now.texts.get(rel, "")) for rel in records))
        from_index = set().union(*(_recorded(rel, now.texts.get(rel, "")) for rel in records
                                   if posixpath.join(posixpath.dirname(rel), "direct_url.json") not in new))
        uninstalled = set().union(*(_recorded(rel, self.before.texts.get(rel, ""))
                                    for rel in removed if rel.endswith(".dist-info/RECORD")))
        found = []
        for rel in changed:
            name = posixpath.basename(rel)
            if rel in from_index:
                continue  # a wheel from the package index (coverage's `a1_coverage.pth`): not built from the workspace
            if name in STARTUP_FILES:
                found.append(f"{rel} was written in the evaluation's environment: it runs in every Python process")
            elif name.endswith(".pth") and (line := _runs_code(now.texts.get(rel, ""))) is not None:
                found.append(f"{rel} was written in the evaluation's environment: site runs its line {line!r} in "
                             "every Python process")
            elif rel not in installed and not name.endswith((".pth", ".egg-link")):  # paths only: legacy develop
                found.append(f"{rel} was {'changed' if rel in old else 'written'} in the evaluation's environment "
                             "outside what an installed distribution lists")
        found += [f"{rel} was removed from the evaluation's environment" for rel in removed if rel not in uninstalled]
        return found
