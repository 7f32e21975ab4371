"""What a query's native format says beyond the `Query` record: scoring rule, timeouts, paths.

`records.Query` carries what every benchmark shares (instruction, starting files, hidden
tests, test commands). Each native format says more: Terminal-Bench's `task.yaml` has
its own agent and test timeouts, Harbor's verifier writes a reward file under
`/logs/verifier/`, Terminal-Bench and Harbor tasks expect the workspace at `/app` and
their tests at `/tests`, R2E-Gym rows carry the expected status of every test and an
image. `TaskSpec` holds that, and each format module builds its own (`nl2repo_spec`, ...).
This module defines only the shared types and names, so every format can import it;
`gyre.benchmarks.registry` sits above the formats and finds a query's spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NL2REPO = "nl2repo"
TERMINAL_BENCH = "terminal-bench"
HARBOR = "harbor"
R2E = "r2e"
SWE_BENCH = "swe-bench"
FORMATS = (NL2REPO, TERMINAL_BENCH, HARBOR, R2E, SWE_BENCH)

SCORING_RULES = {
    NL2REPO: "partial: min(hidden tests passed / test_case_count, 1)",
    TERMINAL_BENCH: "binary: 1 if every test in the report passed, else 0",
    HARBOR: "reward file: /logs/verifier/reward.txt (a float) or reward.json",
    R2E: "binary: 1 if every test's status equals expected_output_json, else 0",
    SWE_BENCH: "binary (SWE-bench's resolved): 1 if every FAIL_TO_PASS and PASS_TO_PASS test passes, else 0",
}
SWE_PARTIAL_CREDIT = "partial-credit"
"""A SWE-bench task built with `--scoring partial-credit`: the share of FAIL_TO_PASS and PASS_TO_PASS tests that
pass, which is NOT SWE-bench's rule (an option whose name says so)."""
SWE_PARTIAL_RULE = "partial credit (not SWE-bench's rule): FAIL_TO_PASS and PASS_TO_PASS tests passed / their number"


@dataclass(frozen=True)
class SweSpec:
    """A SWE-bench instance's grading and environment, as the builder resolved them (`benchmarks.swe_specs`)."""

    repo: str
    """`owner/name`, SWE-bench's `repo`."""
    version: str
    base_commit: str
    python: str
    """The Python its install specification names ("3.9")."""
    requirements: tuple[str, ...]
    """Requirement lines its environment installs first (the repository's requirements file at
    `environment_setup_commit`, or the specification's conda `packages` installed with pip here)."""
    pip_packages: tuple[str, ...]
    pre_install: tuple[str, ...]
    install: str
    """The specification's install command, run in the repository (the image) and again before the tests."""
    test_command: str
    """The specification's test command with the test patch's files as directives."""
    log_parser: str
    """How the repository's own log parser keys a test (`swe_bench_keys`): pytest | pytest-options."""
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    removed_tests: tuple[str, ...] = ()
    """Files the test patch deletes (gone before the tests run, as upstream's `git apply` leaves them)."""
    scoring: str = "resolved"
    """resolved (SWE-bench's rule) or `SWE_PARTIAL_CREDIT`."""
    packages_before: str | None = None
    """The environment's distributions as of this date (`gyre benchmark build swe-bench --packages-before`)."""


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
    dockerfile: str | None = None
    """The task's Dockerfile (Terminal-Bench: `<task>/Dockerfile`; Harbor: `<task>/environment/Dockerfile`), its
    directory the build context: the docker sandbox builds it when `image` is None
    (`gyre.sandboxes.docker_build`). None: the task has none."""
    cpus: float | None = None
    memory_bytes: int | None = None
    allow_internet: bool = False
    expected_statuses: dict[str, str] = field(default_factory=dict)
    """R2E: test id -> expected status (PASSED, FAILED, SKIPPED, ERROR)."""
    replaced_paths: tuple[str, ...] = ()
    """NL2RepoBench: test_files.json's entries as listed (files or directories, relative to the
    workspace). Upstream deletes each from the workspace, directories whole, before the hidden
    tests go in; `query.test_files` is the expanded list of files."""
    image_packages: tuple[str, ...] = ()
    """What the task's image has installed: NL2RepoBench, besides the project (its `start.md`'s
    dependency block, `gyre.benchmarks.image_packages`); Terminal-Bench and Harbor, what its Dockerfile
    pip-installs (`gyre.benchmarks.dockerfile`). Installed in the evaluation environment from the
    package index before the task's commands run, as the image has them."""
    swe: SweSpec | None = None
    """SWE-bench: the instance's grading and environment."""
