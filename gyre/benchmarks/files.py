"""Small readers shared by the native-format loaders: every failure names the file and field.

Benchmarks come from other people's directories; when one is wrong the fix is "edit this
file", so each reader raises `BenchmarkFormatError(path, field, problem)`.
"""

from __future__ import annotations

import json
import math
import tomllib
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
    files = sorted(p.relative_to(tests_dir).as_posix() for p in tests_dir.rglob("*") if p.is_file())
    if not files:
        raise BenchmarkFormatError(tests_dir, field, "holds no files")
    return files


def optional_start_dir(task_dir: Path) -> Path | None:
    """Local convention for container tasks: `<task>/start/` mirrors the workspace's initial files."""
    start = task_dir / "start"
    if start.exists() and not start.is_dir():
        raise BenchmarkFormatError(start, "start_dir", "must be a directory of starting files")
    return start if start.is_dir() else None


def query_dirs(root: Path, marker: str) -> list[Path]:
    """Sub-directories of `root` holding `marker`, sorted; clear errors for a bad root."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: benchmark root does not exist or is not a directory")
    if (root / marker).is_file():
        return [root]
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / marker).is_file())
    if not dirs:
        raise BenchmarkFormatError(root, "queries", f"no query directories (expected <root>/<task>/{marker})")
    return dirs


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
