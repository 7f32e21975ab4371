"""Take pytest's configuration out of the agent's hands before hidden tests run.

An agent rewarded for passing tests will, sooner or later, find that pytest reads
configuration and code from the repository it wrote: a `conftest.py` hook can turn every
failure into a pass, an ini file's `addopts = -p myplugin` loads a module that rewrites
reports, a top-level `pytest.py` shadows pytest itself under `python -m pytest`. This
module removes those from the evaluation copy of a workspace (never the kept workspace)
before the pristine hidden tests are copied in, then pins pytest's rootdir with a
configuration file of our own:

- removed anywhere (files or symlinks): `conftest.py`, `pytest.ini`, `.pytest.ini`, `pytest.toml`,
  `.pytest.toml`, `tox.ini`, `sitecustomize.py`, `usercustomize.py`;
- stripped anywhere: `[tool.pytest*]` tables of `pyproject.toml` and `[tool:pytest]` /
  `[pytest]` sections of `setup.cfg`; a file still carrying pytest settings, or one
  pytest could not parse, is removed. With `keep_root` (NL2RepoBench) the root's
  `pyproject.toml`, `setup.cfg` and `tox.ini` stay whole instead: by then they are the task image's
  (upstream deletes the workspace's, `formats/nl2repo_upstream.py`), their settings were read first
  and the pin carries them on, less what only serves forging (`pytest_settings`); so does the root
  `conftest.py` (upstream's list of deleted files does not name it: deepdiff's tests use its fixtures);
- removed at the top level and in every directory that holds a hidden test file (pytest
  puts those first on `sys.path`): modules (.py, .pyc, .so) or packages that would shadow
  pytest or anything it imports, `shadowing_names()`: derived from the installed pytest's
  own requirements and theirs (iniconfig, pluggy, packaging, pygments, ...), never a
  hand-kept list;
- `__init__.py` in a hidden test directory, or a directory above one, whose pristine files
  do not bring one, is emptied: the tests' relative imports still work (upstream's image keeps
  the project's `tests/__init__.py`), but no agent code runs as the tests' package (a `__path__`
  pointing elsewhere would choose their helpers). The project's own package (a top-level
  directory the hidden tests import, e.g. `cerberus/` above `cerberus/tests/`) keeps its
  `__init__.py`; a pristine module loaded from anywhere else is caught instead
  (`gyre.evaluators.integrity.origins`);
- what Python would import instead of a pristine module (`clear_shadows`, called as the
  pristine files are placed, every format): a package directory, extension module or `.pyc`
  of the same name beside it (`tests/helpers/__init__.py` wins over `tests/helpers.py`), and a
  module named like a directory on its way (`tests.py` wins over a namespace `tests/`).

Hidden test files are copied in afterwards, so a `conftest.py` that belongs to the
benchmark survives. What this cannot stop: code under test runs inside the pytest
process, so a solution that deliberately patches pytest at import time can still forge
results; the result channel and the mutants (`gyre.evaluators.integrity.channel`, `mutants`) catch it.
"""

from __future__ import annotations

import ast
import configparser
import importlib.machinery
import os
import re
import tomllib
from collections.abc import Callable, Iterable
from functools import lru_cache
from importlib import metadata
from pathlib import Path, PurePosixPath

from packaging.requirements import Requirement

from gyre.evaluators import pyparse
from gyre.evaluators.environments.toolenv import top_level_modules
from gyre.sandboxes.paths import clear_path

PLANTED_FILE_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "tox.ini",
        "sitecustomize.py",
        "usercustomize.py",
    }
)
ROOT_CONFIG_NAMES = frozenset(
    {"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "pyproject.toml", "setup.cfg"}
)
ALWAYS_SHADOWING = frozenset({"pytest", "_pytest", "pluggy", "py"})
KEPT_AT_ROOT = frozenset({"pyproject.toml", "setup.cfg", "tox.ini", "conftest.py"})
"""With `keep_root`: root files whose pytest settings the pin carries on (and which builds need), and the
root `conftest.py`: the project's fixtures (deepdiff's tests need the ones its root conftest defines).
It runs in the pytest process as the project's own modules do; what it could forge is detected, not
prevented (`channel`'s "forged" message, the mutants)."""
GYRE_PYTEST_INI = """\
# Written by gyre's evaluator: pins pytest's rootdir to this repository, so configuration
# planted by the agent or lying above the repository is never read. The project's own root
# settings follow, less what only serves forging (gyre.evaluators.integrity.pytest_settings).
[pytest]
"""

_TOML_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_CFG_HEADER = re.compile(r"^\s*\[([^\]]+)\]\s*([#;].*)?$")


@lru_cache(maxsize=1)
def shadowing_names() -> frozenset[str]:
    """Top-level module names of pytest and of every distribution it requires, transitively."""
    names = set(ALWAYS_SHADOWING)
    todo, seen = ["pytest"], set()
    while todo:
        dist = todo.pop()
        key = re.sub(r"[-_.]+", "-", dist).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            found = metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            continue
        top = (found.read_text("top_level.txt") or "").split()
        names |= {n for n in top if n.isidentifier()} | top_level_modules(found)
        for text in found.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return frozenset(n for n in names if not n.startswith("__"))


def neutralise_pytest_config(repo: Path, hidden_test_files: list[str] = (), project_modules: set[str] = frozenset(),
                             keep_root: bool = False) -> list[str]:
    """Clean `repo` in place as the module docstring says; returns what was done, one line each.

    `project_modules`: names the hidden tests import, never removed (a project may BE one
    of pytest's dependencies, e.g. `pygments`; pytest imported its own copy before the
    workspace was on `sys.path`, see `gyre.evaluators.integrity.channel`).
    `keep_root`: the root's `pyproject.toml`, `setup.cfg`, `tox.ini` and `conftest.py` stay as they are:
    their pytest settings were read (`pytest_settings.project_settings`) and gyre's pinned `pytest.ini`,
    which carries them on, takes precedence over them (`KEPT_AT_ROOT`).
    """
    actions: list[str] = []
    hidden = {PurePosixPath(rel) for rel in hidden_test_files}
    test_dirs = sorted({PurePosixPath("."), *(parent for rel in hidden for parent in rel.parents)})
    for rel_dir in test_dirs:
        directory = repo / rel_dir
        if not directory.is_dir() or directory.is_symlink():
            continue
        for entry in sorted(directory.iterdir()):
            importable = entry.is_dir() or entry.suffix in (".py", ".pyc", ".so")
            rel = (rel_dir / entry.name).as_posix()
            module = entry.name.split(".")[0]
            if importable and module in shadowing_names() and module not in project_modules:
                clear_path(repo, rel)
                actions.append(f"removed {rel} (shadows pytest or a module it imports)")
            elif entry.name == "__init__.py" and rel_dir != PurePosixPath(".") and PurePosixPath(rel) not in hidden:
                if rel_dir.parts[0] in project_modules and _holds_project_code(directory, rel_dir, hidden):
                    continue  # the project's own package, which the tests import anyway (cerberus/tests/ lies in it)
                clear_path(repo, rel).write_bytes(b"")
                actions.append(f"emptied {rel} (not part of the pristine tests; kept as a package marker)")
    for path in _files(repo):
        rel = path.relative_to(repo).as_posix()
        if keep_root and path.parent == repo and path.name in KEPT_AT_ROOT and not path.is_symlink():
            continue
        if path.name in PLANTED_FILE_NAMES:
            path.unlink()
            actions.append(f"removed {rel}")
        elif path.is_symlink() and path.name in ("pyproject.toml", "setup.cfg"):
            path.unlink()  # rewriting it would write through the link
            actions.append(f"removed {rel} (a symlink)")
        elif path.name == "pyproject.toml":
            actions += _strip_sections(path, rel, _TOML_HEADER, _is_pytest_table)
            if not _toml_clean(path):
                path.unlink()
                actions.append(f"removed {rel} (still configures pytest or is not valid TOML)")
        elif path.name == "setup.cfg":
            actions += _strip_sections(path, rel, _CFG_HEADER, _is_pytest_section)
            if not _cfg_parses(path):
                path.unlink()
                actions.append(f"removed {rel} (not a valid setup.cfg)")
    return actions


def clear_shadows(dest: Path, rels: Iterable[str]) -> list[str]:
    """Remove from `dest` what Python would import instead of the pristine files `rels` about to be
    placed there (see the module docstring); returns what was removed, one line each."""
    pristine = {PurePosixPath(rel) for rel in rels}
    on_the_way = {parent for rel in pristine for parent in rel.parents if parent != PurePosixPath(".")}
    suffixes = tuple(importlib.machinery.all_suffixes())
    removed = []
    for rel in sorted(pristine | on_the_way):
        if rel in pristine and rel.suffix != ".py":
            continue
        stem = rel.name[:-3] if rel in pristine else rel.name
        parent = dest / rel.parent
        linked = any((dest / up).is_symlink() for up in (rel.parent, *rel.parent.parents))
        if not stem.isidentifier() or linked or not parent.is_dir():
            continue  # a linked or missing directory on the way is replaced whole when the file is placed
        for entry in sorted(parent.iterdir()):
            candidate = rel.parent / entry.name
            module = any(entry.name == stem + suffix for suffix in suffixes)
            package = rel in pristine and entry.name == stem and (entry.is_symlink() or any(
                (entry / f"__init__{suffix}").exists() for suffix in suffixes))  # a data directory stays
            if candidate not in pristine and candidate not in on_the_way and (module or package):
                clear_path(dest, candidate.as_posix())
                removed.append(f"removed {candidate.as_posix()} (would be imported instead of {rel.as_posix()})")
    return removed


def imported_modules(sources: list[str]) -> set[str]:
    """Top-level module names the given Python sources import (unparsable sources give none)."""
    names: set[str] = set()
    for source in sources:
        try:
            tree = pyparse.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def pin_rootdir(repo: Path, hidden_test_files: list[str], settings: str = "") -> bool:
    """Write gyre's pytest.ini at the repo root unless the hidden tests bring a root config; True if written.
    `settings`: the project's own, sanitised (`pytest_settings.render_ini`), carried on under `[pytest]`."""
    if any(rel in ROOT_CONFIG_NAMES for rel in hidden_test_files):
        return False
    clear_path(repo, "pytest.ini").write_text(GYRE_PYTEST_INI + settings, encoding="utf-8")
    return True


def pin_intact(repo: Path, text: str) -> bool:
    """Whether gyre's pinned `pytest.ini` (`pin_rootdir`, written as `text`) is still there as written: the
    repository's root belongs to the sandbox user, who can unlink the root-owned file and put another."""
    path = Path(repo) / "pytest.ini"
    try:
        return not path.is_symlink() and path.stat().st_uid == os.geteuid() and path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        return False


def _holds_project_code(directory: Path, rel_dir: PurePosixPath, hidden: set[PurePosixPath]) -> bool:
    """Whether `directory` is a package of the project: a real directory holding a module of its own
    (not `__init__.py`, not hidden, not a test module), beside a regular `__init__.py`."""
    init = directory / "__init__.py"
    if directory.is_symlink() or init.is_symlink() or not init.is_file():
        return False
    return any(entry.suffix == ".py" and entry.name != "__init__.py" and not entry.name.startswith("test")
               and rel_dir / entry.name not in hidden and entry.is_file() and not entry.is_symlink()
               for entry in directory.iterdir())


def _is_pytest_table(name: str) -> bool:
    """A pyproject.toml table header such as `tool.pytest.ini_options` (quotes and spaces ignored)."""
    return name.replace('"', "").replace("'", "").replace(" ", "").startswith("tool.pytest")


def _is_pytest_section(name: str) -> bool:
    return name.strip() in ("tool:pytest", "pytest")


def _files(repo: Path) -> list[Path]:
    """Files and symlinks (to anything) under `repo`, sorted; symlinked directories are not entered."""
    found = []
    for dirpath, dirnames, filenames in os.walk(repo):
        found += [Path(dirpath, name) for name in filenames]
        found += [Path(dirpath, name) for name in dirnames if Path(dirpath, name).is_symlink()]
    return sorted(found)


def _strip_sections(path: Path, rel: str, header: re.Pattern[str], drop: Callable[[str], bool]) -> list[str]:
    """Remove every section whose header name satisfies `drop`, up to the next header."""
    kept: list[str] = []
    dropped: list[str] = []
    skipping = False
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True):
        match = header.match(line)
        if match:
            skipping = drop(match.group(1))
            if skipping:
                dropped.append(match.group(1))
        if not skipping:
            kept.append(line)
    if not dropped:
        return []
    path.write_text("".join(kept), encoding="utf-8")
    return [f"stripped [{name}] from {rel}" for name in dropped]


def _toml_clean(path: Path) -> bool:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False
    tool = data.get("tool")
    return not (isinstance(tool, dict) and "pytest" in tool)


def _cfg_parses(path: Path) -> bool:
    try:
        configparser.ConfigParser(interpolation=None).read_string(path.read_text(encoding="utf-8"))
    except (configparser.Error, UnicodeDecodeError):
        return False
    return True
