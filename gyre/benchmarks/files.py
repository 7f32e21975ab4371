"""Small readers shared by the native-format loaders: every failure names the file and field.

Benchmarks come from other people's directories; when one is wrong the fix is "edit this
file", so each reader raises `BenchmarkFormatError(path, field, problem)`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.records import Query


def read_text(path: Path, field: str) -> str:
    if not path.is_file():
        raise BenchmarkFormatError(path, field, "missing file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise BenchmarkFormatError(path, field, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def read_yaml_mapping(path: Path, field: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(read_text(path, field))
    except yaml.YAMLError as exc:
        raise BenchmarkFormatError(path, field, f"not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise BenchmarkFormatError(path, field, f"must be a YAML mapping, got {type(data).__name__}")
    return data


def read_toml(path: Path, field: str) -> dict[str, Any]:
    try:
        return tomllib.loads(read_text(path, field))
    except tomllib.TOMLDecodeError as exc:
        raise BenchmarkFormatError(path, field, f"not valid TOML ({exc})") from None


def read_json(path: Path, field: str) -> Any:
    try:
        return json.loads(read_text(path, field))
    except json.JSONDecodeError as exc:
        raise BenchmarkFormatError(path, field, f"not valid JSON ({exc.msg}, line {exc.lineno})") from None


def non_empty_str(value: Any, path: Path, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BenchmarkFormatError(path, field, f"must be a non-empty string, got {str(value)[:60]!r}")
    return value


def positive_seconds(value: Any, path: Path, field: str, default: float | None) -> float | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BenchmarkFormatError(path, field, f"must be a positive number of seconds, got {value!r}")
    return float(value)


def test_files_under(tests_dir: Path, field: str) -> list[str]:
    """Every file under `tests_dir`, relative and sorted; an error if there is none."""
    if not tests_dir.is_dir():
        raise BenchmarkFormatError(tests_dir, field, "missing directory")
    files = files_under(tests_dir)
    if not files:
        raise BenchmarkFormatError(tests_dir, field, "holds no files")
    return files


def files_under(directory: Path) -> list[str]:
    """Every file under `directory` (relative posix paths, sorted), `__pycache__/` left out.

    Symlinked directories are not descended into (a symlinked file counts)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        base = Path(dirpath)
        found.extend((base / name).relative_to(directory).as_posix() for name in filenames
                     if (base / name).is_file())
    return sorted(found)


def optional_start_dir(task_dir: Path) -> Path | None:
    """Local convention for container tasks: `<task>/start/` mirrors the workspace's initial files."""
    start = task_dir / "start"
    if start.exists() and not start.is_dir():
        raise BenchmarkFormatError(start, "start_dir", "must be a directory of starting files")
    return start if start.is_dir() else None


def query_dirs(root: Path, marker: str) -> list[Path]:
    """Sub-directories of `root` holding `marker`, sorted; clear errors for a bad root."""
    dirs, _ = task_dirs(root, marker)
    return dirs


def task_dirs(root: Path, marker: str, hints: tuple[str, ...] = ()) -> tuple[list[Path], list[Problem]]:
    """The task directories under `root` (or `root` itself when it holds `marker`), sorted, and a
    problem for each sub-directory that looks like a task (holds one of `hints`) but lacks `marker`.

    A root that does not exist or holds neither is wholly broken: FileNotFoundError or
    BenchmarkFormatError, raised.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: benchmark root does not exist or is not a directory")
    if (root / marker).is_file():
        return [root], []
    subdirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    dirs = [p for p in subdirs if (p / marker).is_file()]
    orphans = []
    for p in subdirs:
        held = [h for h in hints if (p / h).exists()]
        if p not in dirs and held:
            orphans.append(Problem(str(p), BenchmarkFormatError(
                p / marker, "task", f"missing file (the directory holds {', '.join(held)}, so it looks like a task)"),
                p.name))
    if not dirs and not orphans:
        raise BenchmarkFormatError(root, "queries", f"no query directories (expected <root>/<task>/{marker})")
    return dirs, orphans


TASK_ERRORS: tuple[type[BaseException], ...] = (BenchmarkFormatError, OSError, ValueError, subprocess.SubprocessError)
"""What loading one task may raise that makes that task (and only it) malformed."""


@dataclass(frozen=True)
class Problem:
    """One malformed task: where it is (its directory, or `file:line` for a row), why, and its
    query id when that could still be told."""

    task: str
    error: BaseException
    query_id: str | None = None

    @property
    def reason(self) -> str:
        return str(self.error) or type(self.error).__name__


def load_each(tasks: Iterable[tuple[str, str | None, Callable[[], Query]]]) -> tuple[list[Query], list[Problem]]:
    """Run each task's loader; a task that fails with one of `TASK_ERRORS` becomes a Problem,
    the others load: one malformed task never blocks the rest."""
    queries: list[Query] = []
    problems: list[Problem] = []
    for task, query_id, load in tasks:
        try:
            queries.append(load())
        except TASK_ERRORS as exc:
            problems.append(Problem(task, exc, query_id))
    return queries, problems


def raise_first(queries: list[Query], problems: list[Problem]) -> list[Query]:
    """The strict loaders' rule: every query, or the first malformed task's own error."""
    if problems:
        raise problems[0].error
    return queries


def script_task_query(
    task_dir: Path, benchmark: str, instruction: str, tests_dir: str, test_files: list[str], script: str,
    tests_mount: str,
) -> Query:
    """A task scored by one verifier script run from the tests mount (Terminal-Bench, Harbor);
    `tests_dir` holds its tests, relative to `task_dir`."""
    return Query(
        query_id=task_dir.name,
        benchmark=benchmark,
        instruction=instruction,
        root=task_dir,
        start_dir=optional_start_dir(task_dir),
        hidden_tests_dir=task_dir / tests_dir,
        test_files=test_files,
        test_commands=[f"bash {tests_mount}/{script}"],
        test_case_count=1,
    )
