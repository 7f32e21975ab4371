"""Load Terminal-Bench tasks from their native directory layout.

Terminal-Bench asks an agent to get something done in a terminal; a task passes when
every test of its pytest suite passes (binary). One directory per task:

    <root>/<task>/task.yaml      instruction, max_agent_timeout_sec (360), max_test_timeout_sec (60),
                                 parser_name (pytest), difficulty, run_tests_in_same_shell, ...
    <root>/<task>/run-tests.sh   runs the tests (upstream: copied to /tests, run from /app)
    <root>/<task>/tests/         the hidden tests (test_outputs.py ...)
    <root>/<task>/Dockerfile     the task's image (docker backend); WORKDIR is /app
    <root>/<task>/docker-compose.yaml  upstream's services (`client` is the agent's container)
    <root>/<task>/solution.sh    upstream's oracle (ignored here)
    <root>/<task>/start/         local convention: the files the image puts in /app (optional)

Upstream (laude-institute/terminal-bench, `terminal_bench/harness/harness.py`), after the
agent stops, `run-tests.sh` and `tests/` are copied into the SAME container at `/tests`
(TEST_DIR=/tests) and `bash /tests/run-tests.sh` runs from the WORKDIR (`/app`): whatever
the agent left running (a server on a port) is still up. The standard `run-tests.sh`
installs curl with apt-get, uv with `curl ... astral.sh/uv/<v>/install.sh | sh`, makes
`uv venv .tbench-testing`, `uv pip install pytest==8.4.1`, then `uv run pytest
$TEST_DIR/test_outputs.py -rA`; the pane's "short test summary info" section is parsed
and the task is resolved iff every parsed test passed (SKIPPED and XFAIL count as
passed). Here the workspace is `/app`, the pristine files appear read-only at `/tests`.
Only the `pytest` parser is supported; another is a format error naming the field.
`load_terminal_bench_report` loads the good tasks and lists the malformed ones.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from gyre.benchmarks.dockerfile import pip_packages
from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.files import (
    Problem, load_each, non_empty_str, positive_seconds, raise_first, read_yaml_mapping, script_task_query, task_dirs,
    test_files_under,
)
from gyre.benchmarks.spec import SCORING_RULES, TERMINAL_BENCH, TaskSpec
from gyre.records import Query

TASK_YAML = "task.yaml"
RUN_TESTS = "run-tests.sh"
TESTS_DIR = "tests"
WORKDIR = "/app"
TESTS_MOUNT = "/tests"
DEFAULT_AGENT_TIMEOUT_S = 360.0
DEFAULT_TEST_TIMEOUT_S = 60.0
SUPPORTED_PARSERS = ("pytest",)


def load_terminal_bench(root: Path, benchmark: str = "terminal-bench") -> list[Query]:
    """Every task under `root` (or `root` itself if it is a task), sorted by directory name;
    raises the first malformed task's error."""
    return raise_first(*load_terminal_bench_report(root, benchmark))


def load_terminal_bench_report(root: Path, benchmark: str = "terminal-bench") -> tuple[list[Query], list[Problem]]:
    """The good tasks under `root` and a Problem per malformed one (a directory holding
    run-tests.sh or tests/ without task.yaml included); raises only for a wholly broken root."""
    dirs, orphans = task_dirs(root, TASK_YAML, hints=(RUN_TESTS, TESTS_DIR))
    queries, problems = load_each((str(d), d.name, partial(load_terminal_bench_task, d, benchmark)) for d in dirs)
    return queries, sorted(problems + orphans, key=lambda p: p.task)


def load_terminal_bench_task(task_dir: Path, benchmark: str = "terminal-bench") -> Query:
    task_dir = Path(task_dir)
    terminal_bench_spec(task_dir)  # validates task.yaml's fields
    data = read_yaml_mapping(task_dir / TASK_YAML, "task")
    instruction = non_empty_str(data.get("instruction"), task_dir / TASK_YAML, "instruction")
    if not (task_dir / RUN_TESTS).is_file():
        raise BenchmarkFormatError(task_dir / RUN_TESTS, "run_tests", "missing file")
    test_files = test_files_under(task_dir / TESTS_DIR, "tests")
    return script_task_query(task_dir, benchmark, instruction, TESTS_DIR, test_files, RUN_TESTS, TESTS_MOUNT)


def terminal_bench_spec(task_dir: Path) -> TaskSpec:
    path = Path(task_dir) / TASK_YAML
    data = read_yaml_mapping(path, "task")
    parser = data.get("parser_name", "pytest")
    if parser not in SUPPORTED_PARSERS:
        raise BenchmarkFormatError(path, "parser_name", f"must be one of {SUPPORTED_PARSERS}, got {parser!r}")
    return TaskSpec(
        format=TERMINAL_BENCH,
        scoring=SCORING_RULES[TERMINAL_BENCH],
        agent_timeout_s=positive_seconds(data.get("max_agent_timeout_sec"), path, "max_agent_timeout_sec",
                                         DEFAULT_AGENT_TIMEOUT_S),
        test_timeout_s=positive_seconds(data.get("max_test_timeout_sec"), path, "max_test_timeout_sec",
                                        DEFAULT_TEST_TIMEOUT_S),
        workdir=WORKDIR,
        tests_mount=TESTS_MOUNT,
        dockerfile=str(Path(task_dir).resolve() / "Dockerfile") if (Path(task_dir) / "Dockerfile").is_file() else None,
        image_packages=pip_packages(Path(task_dir) / "Dockerfile"),
    )
