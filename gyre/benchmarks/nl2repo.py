"""Load NL2RepoBench-style queries from their native directory layout.

NL2RepoBench asks an agent to write a whole repository from a natural-language
description; the score is the share of hidden test cases that pass. Its native layout,
one directory per project, is:

    <root>/<project>/start.md              the instruction given to the agent
    <root>/<project>/test_case_count.txt   positive integer: the score's denominator
    <root>/<project>/test_commands.json    JSON list of shell commands that run the tests
    <root>/<project>/test_files.json       JSON list of test file paths, relative to the repo

Upstream the hidden tests live inside a per-project container image. Our local
convention keeps them on disk instead:

    <root>/<project>/hidden_tests/<path from test_files.json>   pristine hidden tests
    <root>/<project>/start/                                     optional starting files

Anything else in a project directory (the `tiny` set's `reference/` solutions, for
example) is ignored here and never reaches a workspace. Directories whose name starts
with '.' are skipped. Every malformed item raises `BenchmarkFormatError` naming the file
and the field, so a broken benchmark fails at load time, not mid-run.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.files import read_text
from gyre.records import Query

INSTRUCTION_FILE = "start.md"
TEST_CASE_COUNT_FILE = "test_case_count.txt"
TEST_COMMANDS_FILE = "test_commands.json"
TEST_FILES_FILE = "test_files.json"
HIDDEN_TESTS_DIR = "hidden_tests"
START_DIR = "start"


def load_nl2repo(root: Path, benchmark: str = "nl2repobench") -> list[Query]:
    """All queries under `root`, sorted by project directory name (= query_id)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: benchmark root does not exist or is not a directory")
    project_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not project_dirs:
        raise BenchmarkFormatError(
            root, "queries", f"no query directories (expected <root>/<project>/{INSTRUCTION_FILE} ...)"
        )
    return [load_nl2repo_query(project_dir, benchmark) for project_dir in project_dirs]


def load_nl2repo_query(project_dir: Path, benchmark: str = "nl2repobench") -> Query:
    """One query from one project directory in the layout described above."""
    project_dir = Path(project_dir)
    instruction = read_text(project_dir / INSTRUCTION_FILE, "instruction")
    if not instruction.strip():
        raise BenchmarkFormatError(project_dir / INSTRUCTION_FILE, "instruction", "must not be empty")
    test_case_count = _parse_positive_int(project_dir / TEST_CASE_COUNT_FILE, "test_case_count")
    test_commands = _read_string_list(project_dir / TEST_COMMANDS_FILE, "test_commands")
    test_files = _read_string_list(project_dir / TEST_FILES_FILE, "test_files")

    hidden_tests_dir = project_dir / HIDDEN_TESTS_DIR
    for i, rel in enumerate(test_files):
        field = f"test_files[{i}]"
        rel_path = PurePosixPath(rel)
        if rel_path.is_absolute() or ".." in rel_path.parts:
            raise BenchmarkFormatError(
                project_dir / TEST_FILES_FILE, field, f"must be a path inside the repository, got {rel!r}"
            )
        if not (hidden_tests_dir / rel_path).is_file():
            raise BenchmarkFormatError(
                hidden_tests_dir / rel_path,
                field,
                f"hidden test file listed in {TEST_FILES_FILE} is missing",
            )

    start_dir = project_dir / START_DIR
    if start_dir.exists() and not start_dir.is_dir():
        raise BenchmarkFormatError(start_dir, "start_dir", "must be a directory of starting files")

    return Query(
        query_id=project_dir.name,
        benchmark=benchmark,
        instruction=instruction,
        root=project_dir,
        start_dir=start_dir if start_dir.is_dir() else None,
        hidden_tests_dir=hidden_tests_dir,
        test_files=test_files,
        test_commands=test_commands,
        test_case_count=test_case_count,
    )


def _parse_positive_int(path: Path, field: str) -> int:
    text = read_text(path, field).strip()
    if not (text.isascii() and text.isdigit() and int(text) > 0):
        raise BenchmarkFormatError(path, field, f"must be a positive integer, got {text[:40]!r}")
    return int(text)


def _read_string_list(path: Path, field: str) -> list[str]:
    text = read_text(path, field)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchmarkFormatError(path, field, f"not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(value, list):
        raise BenchmarkFormatError(path, field, f"must be a JSON list of strings, got {type(value).__name__}")
    if not value:
        raise BenchmarkFormatError(path, field, "must not be an empty list")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise BenchmarkFormatError(path, f"{field}[{i}]", f"must be a non-empty string, got {item!r}")
    return value
