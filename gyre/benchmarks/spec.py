"""What a query's native format says beyond the `Query` record: scoring rule, timeouts, paths.

`records.Query` carries what every benchmark shares (instruction, starting files, hidden
tests, test commands). Each native format says more: Terminal-Bench's `task.yaml` has
its own agent and test timeouts, Harbor's verifier writes a reward file under
`/logs/verifier/`, Terminal-Bench and Harbor tasks expect the workspace at `/app` and
their tests at `/tests`, R2E-Gym rows carry the expected status of every test and an
image. `TaskSpec` holds that; `task_spec(query)` derives it from the query's directory
(`query.root`, in its native layout) by looking at which native file it holds, so the
record crossing boundaries stays the same for every format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.records import Query

NL2REPO = "nl2repo"
TERMINAL_BENCH = "terminal-bench"
HARBOR = "harbor"
R2E = "r2e"
FORMATS = (NL2REPO, TERMINAL_BENCH, HARBOR, R2E)

SCORING_RULES = {
    NL2REPO: "partial: min(hidden tests passed / test_case_count, 1)",
    TERMINAL_BENCH: "binary: 1 if every test in the report passed, else 0",
    HARBOR: "reward file: /logs/verifier/reward.txt (a float) or reward.json",
    R2E: "binary: 1 if every test's status equals expected_output_json, else 0",
}


@dataclass(frozen=True)
class TaskSpec:
    """A query's format-specific facts; None means "not said by the format"."""

    format: str
    scoring: str
    agent_timeout_s: float | None = None
    test_timeout_s: float | None = None
    workdir: str | None = None
    """Where the task expects its workspace inside the sandbox (`/app`); None: anywhere."""
    tests_mount: str | None = None
    """Where the pristine tests appear during evaluation (`/tests`); None: inside the workspace."""
    logs_dir: str | None = None
    """A writable log directory the task expects (Harbor: `/logs`)."""
    image: str | None = None
    cpus: float | None = None
    memory_bytes: int | None = None
    allow_internet: bool = False
    expected_statuses: dict[str, str] = field(default_factory=dict)
    """R2E: test id -> expected status (PASSED, FAILED, SKIPPED, ERROR)."""
    replaced_paths: tuple[str, ...] = ()
    """NL2RepoBench: test_files.json's entries as listed (files or directories, relative to the
    workspace). Upstream deletes each from the workspace, directories whole, before the hidden
    tests go in; `query.test_files` is the expanded list of files."""


def detect_format(task_dir: Path) -> str:
    """Which native format a query directory is in, from the file that marks it."""
    from gyre.benchmarks.harbor import TASK_TOML
    from gyre.benchmarks.nl2repo import INSTRUCTION_FILE
    from gyre.benchmarks.r2e import ROW_FILE
    from gyre.benchmarks.terminal_bench import TASK_YAML

    markers = {TASK_YAML: TERMINAL_BENCH, TASK_TOML: HARBOR, ROW_FILE: R2E, INSTRUCTION_FILE: NL2REPO}
    for marker, fmt in markers.items():
        if (Path(task_dir) / marker).is_file():
            return fmt
    raise BenchmarkFormatError(task_dir, "format", f"no {', '.join(markers)} found: not a query directory")


def task_spec(query: Query) -> TaskSpec:
    """The format-specific facts of `query`, read again from `query.root`."""
    fmt = detect_format(query.root)
    if fmt == TERMINAL_BENCH:
        from gyre.benchmarks.terminal_bench import terminal_bench_spec

        return terminal_bench_spec(query.root)
    if fmt == HARBOR:
        from gyre.benchmarks.harbor import harbor_spec

        return harbor_spec(query.root)
    if fmt == R2E:
        from gyre.benchmarks.r2e import r2e_spec

        return r2e_spec(query.root)
    from gyre.benchmarks.nl2repo import nl2repo_spec

    return nl2repo_spec(query.root)
