"""A pristine module loaded from anywhere but its pristine file is tampering.

The hidden tests import their helpers by package path (`from tests.unit.helpers import check`,
`from .util import x`). A package's `__init__.py` runs before its modules and can point `__path__`
anywhere: a workspace that keeps one above the hidden tests (the project's own package, which gyre no
longer empties: `pytest_guard`) could hand the tests helpers of its own, which make every check vacuous.
pytest itself refuses a test module imported from the wrong file (`ImportPathMismatchError`); nothing
refuses a helper. So gyre's result plugin reports, after collection and at the end of the session, every
module of `sys.modules` loaded from under the rootdir (`channel.ChannelResults.modules`), and a module
whose dotted name is one a pristine file is imported as (`tests.unit.helpers` for
`tests/unit/helpers.py`: the last two or more parts of its path) but whose file is not that pristine
file is tampering, with the evidence. A bare name (`helpers`) is not checked: it is also what any
project module of that name is called. The hidden tests' directories are writable during the evaluation
(tests write beside themselves: `privileges.protect(writable_dirs=True)`), so a module loaded from one of
them that was not there when the pristine files were placed (`written_beside`) is tampering too: a
`conftest.py` a setup command planted would otherwise run inside pytest.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gyre.evaluators.integrity.channel import ChannelResults
from gyre.evaluators.integrity.pytest_guard import ROOT_CONFIG_NAMES, pin_intact
from gyre.sandboxes.fdwalk import read_regular

MAX_DATA_BYTES = 256 * 1024 * 1024
"""A pristine data file is read back (after a setup command) up to this size; a larger one reads as changed."""


def dotted_names(rel: str) -> list[str]:
    """The package-qualified names a pristine file `rel` is imported as (`a/b/c.py` -> `b.c`, `a.b.c`)."""
    path = PurePosixPath(rel)
    if path.suffix != ".py":
        return []
    parts = [*path.parent.parts, path.stem] if path.stem != "__init__" else list(path.parent.parts)
    if not all(part.isidentifier() for part in parts):
        return []
    return [".".join(parts[-k:]) for k in range(2, len(parts) + 1)]


def _test_dirs(repo: Path, rels: Iterable[str]) -> set[Path]:
    """The pristine files' directories and theirs up to (not including) `repo`: the ones made writable."""
    repo = Path(repo)
    return {parent for rel in rels for parent in (repo / rel).parents if parent != repo and parent.is_relative_to(repo)}


def written_beside(repo: Path, rels: Iterable[str]) -> frozenset[str]:
    """The Python and pytest configuration files in the hidden tests' directories (`_test_dirs`) now,
    before any test command: one found there later that is not in this set was written during the
    evaluation."""
    return frozenset(os.path.normpath(str(p)) for d in _test_dirs(repo, rels) if d.is_dir() and not d.is_symlink()
                     for p in d.iterdir() if p.suffix == ".py" or p.name in ROOT_CONFIG_NAMES)


def planted_configs(repo: Path, rels: Iterable[str], present: frozenset[str]) -> list[str]:
    """Tampering evidence: pytest configuration files written into the hidden tests' directories during the
    evaluation (a setup command's `tests/pytest.ini` would move pytest's rootdir and load a plugin)."""
    return sorted(f"{p} was written beside the hidden tests during the evaluation (a pytest configuration)"
                  for d in _test_dirs(repo, rels) if d.is_dir() and not d.is_symlink()
                  for p in map(str, d.iterdir())
                  if os.path.basename(p) in ROOT_CONFIG_NAMES and os.path.normpath(p) not in present)


def mismatches(rels: Iterable[str], inside: str, runs: Iterable[ChannelResults],
               present: frozenset[str] = frozenset()) -> list[str]:
    """Tampering evidence: pristine modules (`rels`, placed under `inside`) loaded from other files, and
    modules loaded from a pristine file's directory that were written there during the evaluation (a
    `conftest.py` or `__init__.py` a setup command or an earlier test module planted; not in `present`)."""
    rels = list(rels)
    pristine = {os.path.normpath(os.path.join(inside, rel)) for rel in rels}
    directories = {os.path.normpath(str(d)) for d in _test_dirs(Path(inside), rels)}  # the repository root is not one
    expected: dict[str, str] = {}
    for rel in rels:
        for name in dotted_names(rel):
            expected.setdefault(name, os.path.normpath(os.path.join(inside, rel)))
    found = []
    for run in runs:
        for name, files in run.modules.items():
            want = expected.get(name)
            for file in sorted(os.path.normpath(f) for f in files):
                if want is not None and file != want:
                    found.append(f"module {name} was loaded from {file}, not from its pristine file {want}")
                elif file not in pristine and file not in present and os.path.dirname(file) in directories:
                    found.append(f"module {name} was loaded from {file}, written beside the hidden tests "
                                 "during the evaluation")
    return sorted(set(found))


@dataclass(frozen=True)
class Watch:
    """What the hidden tests' surroundings looked like before the first command, checked after each one: gyre's
    pinned `pytest.ini` still its own (`pin`, None when the hidden tests bring the root configuration), no
    pytest configuration written beside the hidden tests (`present`: the files there before), and, after a
    command that ran no test (a setup command: the workspace's build), the pristine data files as placed
    (`data`: rel -> sha256; they are the tests' to change, `privileges.protect(writable_data=True)`, not the
    build's: a `setup.py` that rewrites an expected output would make its test vacuous)."""

    repo: Path
    rels: tuple[str, ...]
    present: frozenset[str]
    pin: str | None
    data: tuple[tuple[str, str], ...] = ()

    @classmethod
    def start(cls, repo: Path, rels: Iterable[str], pin: str | None, data: dict[str, bytes] | None = None) -> Watch:
        """`data`: the pristine data files placed (rel -> content)."""
        rels = tuple(rels)
        digests = tuple(sorted((rel, hashlib.sha256(content).hexdigest()) for rel, content in (data or {}).items()))
        return cls(Path(repo), rels, written_beside(repo, rels), pin, digests)

    def broken(self, setup: bool = False) -> list[str]:
        """Tampering evidence now (empty when nothing moved); `setup`: the command just run ran no test."""
        found = planted_configs(self.repo, self.rels, self.present)
        if self.pin is not None and not pin_intact(self.repo, self.pin):
            found.append("gyre's pytest.ini at the repository root was replaced or removed during the evaluation")
        if setup:
            for rel, digest in self.data:
                now = read_regular(self.repo, rel, MAX_DATA_BYTES)
                if now is None or hashlib.sha256(now).hexdigest() != digest:
                    found.append(f"the hidden tests' data file {rel} was changed by a command that ran no test")
        return found
