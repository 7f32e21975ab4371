"""Load NL2RepoBench-style queries from their native directory layout.

NL2RepoBench asks an agent to write a whole repository from a natural-language
description; the score is the share of hidden test cases that pass. Its native layout
(multimodal-art-projection/NL2RepoBench: `test_files/<project>/`), one directory per
project, is:

    <root>/<project>/start.md              the instruction given to the agent
    <root>/<project>/test_case_count.txt   positive integer: the score's denominator
    <root>/<project>/test_commands.json    JSON list of shell commands, run in order: setup
                                           commands (`pip install -e .`, `touch README.md &&
                                           pip install -e .`, `echo ... > x/version.py`,
                                           `python install.py`) then pytest
    <root>/<project>/test_files.json       JSON list of test paths, relative to the repo: files
                                           or DIRECTORIES (94 of the 104 projects list one,
                                           `["tests"]`; a trailing '/' is allowed: `tests/keys/`)

Upstream the hidden tests live inside a per-project container image. Our local
convention keeps them on disk instead:

    <root>/<project>/hidden_tests/<path from test_files.json>   pristine hidden tests
    <root>/<project>/start/                                     optional starting files
    <root>/<project>/image_workspace/   optional: what the task's image holds under /workspace besides the
                                        hidden tests (its package and configuration files); laid under the
                                        cleaned workspace before the tests run
                                        (`gyre.evaluators.formats.nl2repo_upstream`)

A listed directory stands for every file under it (conftest.py, __init__.py and data
files included; `__pycache__/` left out): the query's `test_files` is that expanded list
of files, relative posix paths, sorted. The entries as listed are in
`task_spec(query).replaced_paths`: upstream deletes each of them from the workspace
(directories whole) before the hidden tests go in.

Anything else in a project directory (the `tiny` set's `reference/` solutions, for
example) is ignored here and never reaches a workspace. Directories whose name starts
with '.' are skipped. Every malformed item raises `BenchmarkFormatError` naming the file
and the field; `load_nl2repo_report` loads the good projects and lists the malformed ones.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path, PurePosixPath

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.files import Problem, files_under, load_each, raise_first, read_text
from gyre.benchmarks.image_packages import image_packages
from gyre.benchmarks.spec import NL2REPO, SCORING_RULES, TaskSpec
from gyre.records import Query

INSTRUCTION_FILE = "start.md"
TEST_CASE_COUNT_FILE = "test_case_count.txt"
TEST_COMMANDS_FILE = "test_commands.json"
TEST_FILES_FILE = "test_files.json"
HIDDEN_TESTS_DIR = "hidden_tests"
WORKSPACE_DIR = "/workspace"
"""Where upstream's image holds the project (`WORKDIR /workspace`, `ENV PYTHONPATH=/workspace`): the workspace's
place in a docker sandbox, and the tests'."""
START_DIR = "start"
IMAGE_WORKSPACE_DIR = "image_workspace"
"""Local convention: the files upstream's image holds under `/workspace` besides the hidden tests (`docker cp` them
out with the tests): the project's own `pyproject.toml`, `setup.py`, ... that survive upstream's deletion of the
workspace's."""

UPSTREAM_REMOVED_PACKAGE_FILES = (
    "setup.py", "pyproject.toml", "setup.cfg", "requirements.txt", "requirements-dev.txt",
    "requirements-test.txt", "tox.ini", "pytest.ini", "poetry.lock", "Pipfile", "Pipfile.lock",
    "environment.yml", "conda-env.yaml", "manifest.in", "MANIFEST.in",
)
"""File names upstream deletes anywhere in the agent's workspace before testing
(`openhands/post_processor.py: remove_package_files`); the test image supplies its own (`IMAGE_WORKSPACE_DIR`)."""


def parses_pytest_output(command: str) -> bool:
    """Whether upstream counts this command's output: only commands whose text contains
    "pytest" (any case) are scanned for `(\\d+) passed`; the others are setup."""
    return "pytest" in command.lower()


def load_nl2repo(root: Path, benchmark: str = "nl2repobench") -> list[Query]:
    """All queries under `root`, sorted by project directory name (= query_id); raises the
    first malformed project's error."""
    return raise_first(*load_nl2repo_report(root, benchmark))


def load_nl2repo_report(root: Path, benchmark: str = "nl2repobench") -> tuple[list[Query], list[Problem]]:
    """The good queries under `root` and a Problem per malformed project; raises only for a
    wholly broken root (missing, or no project directory)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: benchmark root does not exist or is not a directory")
    project_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not project_dirs:
        raise BenchmarkFormatError(
            root, "queries", f"no query directories (expected <root>/<project>/{INSTRUCTION_FILE} ...)"
        )
    return load_each((str(p), p.name, partial(load_nl2repo_query, p, benchmark)) for p in project_dirs)


def load_nl2repo_query(project_dir: Path, benchmark: str = "nl2repobench") -> Query:
    """One query from one project directory in the layout described above."""
    project_dir = Path(project_dir)
    instruction = read_text(project_dir / INSTRUCTION_FILE, "instruction")
    if not instruction.strip():
        raise BenchmarkFormatError(project_dir / INSTRUCTION_FILE, "instruction", "must not be empty")
    test_case_count = _parse_positive_int(project_dir / TEST_CASE_COUNT_FILE, "test_case_count")
    test_commands = _read_string_list(project_dir / TEST_COMMANDS_FILE, "test_commands")
    hidden_tests_dir = project_dir / HIDDEN_TESTS_DIR
    test_files = _expand_test_files(project_dir, hidden_tests_dir, _test_entries(project_dir))

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


def nl2repo_spec(project_dir: Path) -> TaskSpec:
    """The format's facts for one project: its scoring rule, the paths its hidden tests replace and
    the packages its image holds (start.md's dependency block; the project's own name left out)."""
    project_dir = Path(project_dir)
    start_md = read_text(project_dir / INSTRUCTION_FILE, "instruction")
    return TaskSpec(format=NL2REPO, scoring=SCORING_RULES[NL2REPO],
                    replaced_paths=tuple(_test_entries(project_dir)),
                    image_packages=image_packages(start_md, project_dir.name))


def _test_entries(project_dir: Path) -> list[str]:
    """test_files.json's entries, normalised (`./tests/` -> `tests`), checked to stay inside the repo."""
    path = project_dir / TEST_FILES_FILE
    entries = []
    for i, rel in enumerate(_read_string_list(path, "test_files")):
        rel_path = PurePosixPath(rel.strip())
        if rel_path.is_absolute() or ".." in rel_path.parts:
            raise BenchmarkFormatError(path, f"test_files[{i}]", f"must be a path inside the repository, got {rel!r}")
        if not rel_path.parts:
            raise BenchmarkFormatError(path, f"test_files[{i}]",
                                       f"must name a file or directory, not the repository itself, got {rel!r}")
        entries.append(rel_path.as_posix())
    return entries


def _expand_test_files(project_dir: Path, hidden_tests_dir: Path, entries: list[str]) -> list[str]:
    """The files the entries stand for (a directory: every file under it), sorted, each once."""
    files: set[str] = set()
    for i, rel in enumerate(entries):
        field = f"test_files[{i}]"
        target = hidden_tests_dir / rel
        if target.is_dir():
            under = files_under(target)
            if not under:
                raise BenchmarkFormatError(target, field, f"directory listed in {TEST_FILES_FILE} holds no files")
            files.update(f"{rel}/{name}" for name in under)
        elif target.is_file():
            files.add(rel)
        else:
            raise BenchmarkFormatError(
                target, field, f"hidden test file or directory listed in {TEST_FILES_FILE} is missing"
            )
    return sorted(files)


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
