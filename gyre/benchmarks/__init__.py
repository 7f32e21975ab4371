"""Benchmarks: turn a directory of benchmark items into validated `Query` records.

One entry point, `load_benchmark(kind, root, name)`, so flows and the CLI never know
which loader they call: every query, or the first malformed task's error. Its tolerant
twin `load_benchmark_report(kind, root, name)` returns the good queries and a
`(task, reason)` pair per malformed task, so one broken task never blocks the others;
both still raise for a wholly broken root (missing, no task in it, format unknown).
Kinds (native on-disk formats, each in its own module):

- `nl2repo`: NL2RepoBench (`start.md`, `test_case_count.txt`, ...); the bundled `tiny`
  set (`gyre.benchmarks.tiny`) is written in the same layout and loads through it;
- `terminal-bench`: Terminal-Bench (`task.yaml`, `tests/`, `run-tests.sh`);
- `harbor`: Harbor (`task.toml`, `instruction.md`, `tests/test.sh`);
- `r2e`: R2E-Gym / DeepSWE rows (`*.jsonl` + local repositories and hidden tests);
- `swe-bench`: SWE-bench instances built from rows and the repositories' histories (`instance.json`,
  `environment.json`, `start/`, `hidden_tests/`; `gyre.benchmarks.swe_build` makes them);
- `auto`: whichever of these the directory holds (`detect_benchmark_format`).

Format-specific facts (timeouts, scoring rule, expected paths) come from
`gyre.benchmarks.registry.task_spec(query)`; `describe_benchmark` lists them for people
bringing their own task sets.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.files import Problem, raise_first
from gyre.benchmarks.harbor import TASK_TOML, load_harbor, load_harbor_report
from gyre.benchmarks.nl2repo import INSTRUCTION_FILE, load_nl2repo, load_nl2repo_report
from gyre.benchmarks.r2e import load_r2e, load_r2e_report
from gyre.benchmarks.registry import task_spec
from gyre.benchmarks.spec import HARBOR, NL2REPO, R2E, SWE_BENCH, TERMINAL_BENCH, TaskSpec
from gyre.benchmarks.swe_bench import INSTANCE_FILE, load_swe_bench, load_swe_bench_report
from gyre.benchmarks.terminal_bench import TASK_YAML, load_terminal_bench, load_terminal_bench_report
from gyre.benchmarks.tiny import generate_tiny
from gyre.records import Query

LOADERS: dict[str, Callable[..., list[Query]]] = {
    NL2REPO: load_nl2repo,
    TERMINAL_BENCH: load_terminal_bench,
    HARBOR: load_harbor,
    R2E: load_r2e,
    SWE_BENCH: load_swe_bench,
}
REPORT_LOADERS: dict[str, Callable[..., tuple[list[Query], list[Problem]]]] = {
    NL2REPO: load_nl2repo_report,
    TERMINAL_BENCH: load_terminal_bench_report,
    HARBOR: load_harbor_report,
    R2E: load_r2e_report,
    SWE_BENCH: load_swe_bench_report,
}
KINDS = ("auto", *LOADERS)

__all__ = [
    "BenchmarkFormatError", "KINDS", "LOADERS", "Problem", "TaskSpec", "describe_benchmark", "describe_queries",
    "detect_benchmark_format", "generate_tiny", "load_benchmark", "load_benchmark_problems", "load_benchmark_report",
    "load_nl2repo", "resolve_kind", "task_spec",
]


def load_benchmark(kind: str, root: Path, name: str | None = None) -> list[Query]:
    """Load every query of a benchmark of `kind` stored under `root`; the first malformed
    task's error is raised (`BenchmarkFormatError` naming its file and field).

    `name` becomes each query's `benchmark` field (for example "tiny"); None keeps the
    loader's default (the format's name, "nl2repobench" for `nl2repo`).
    """
    return raise_first(*load_benchmark_problems(kind, root, name))


def load_benchmark_report(kind: str, root: Path, name: str | None = None) -> tuple[list[Query], list[tuple[str, str]]]:
    """The good queries of the benchmark under `root`, and `(task, reason)` for each malformed
    task (task: its directory, or `file:line` for an R2E row; reason: the error, naming the
    file and field). Raises only when `root` is wholly broken: FileNotFoundError,
    BenchmarkFormatError (no task in it, format undetectable) or ValueError (unknown kind)."""
    queries, problems = load_benchmark_problems(kind, root, name)
    return queries, [(p.task, p.reason) for p in problems]


def load_benchmark_problems(kind: str, root: Path, name: str | None = None) -> tuple[list[Query], list[Problem]]:
    """`load_benchmark_report` with each problem's exception and (when it can be told) query id."""
    kind = resolve_kind(kind, root)
    loader = REPORT_LOADERS[kind]
    return loader(Path(root)) if name is None else loader(Path(root), name)


def resolve_kind(kind: str, root: Path) -> str:
    """`kind` itself, or for "auto" the format detected under `root`; ValueError for an unknown kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown benchmark kind {kind!r}; known kinds: {', '.join(KINDS)}")
    return detect_benchmark_format(Path(root)) if kind == "auto" else kind


def detect_benchmark_format(root: Path) -> str:
    """The native format of the benchmark under `root` (or of `root` itself, one task)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: benchmark root does not exist or is not a directory")
    if any(root.glob("*.jsonl")):
        return R2E
    markers = {TASK_YAML: TERMINAL_BENCH, TASK_TOML: HARBOR, INSTANCE_FILE: SWE_BENCH, INSTRUCTION_FILE: NL2REPO}
    candidates = [root, *sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))]
    found = {fmt for d in candidates for marker, fmt in markers.items() if (d / marker).is_file()}
    if len(found) != 1:
        problem = "mixes formats " + ", ".join(sorted(found)) if found else (
            f"holds none of {', '.join(markers)} or *.jsonl")
        raise BenchmarkFormatError(root, "format", f"cannot tell the format: {problem}; pass --format")
    return found.pop()


def describe_benchmark(root: Path, kind: str = "auto") -> list[dict[str, Any]]:
    """One plain dict per query (id, format, timeouts, scoring rule): what `gyre benchmark ls` prints."""
    return describe_queries(load_benchmark(kind, root))


def describe_queries(queries: list[Query]) -> list[dict[str, Any]]:
    """`describe_benchmark`'s rows for queries already loaded."""
    rows = []
    for query in queries:
        spec = task_spec(query)
        rows.append({
            "id": query.query_id,
            "format": spec.format,
            "agent_timeout_s": spec.agent_timeout_s,
            "test_timeout_s": spec.test_timeout_s,
            "scoring": spec.scoring,
            "test_case_count": query.test_case_count,
            "workdir": spec.workdir,
            "image": spec.image,
        })
    return rows
