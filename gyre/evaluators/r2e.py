"""Score R2E-Gym / DeepSWE instances: every listed test must end with its expected status.

The agent edited a real repository, whose own `conftest.py` and pytest configuration are
legitimate, so they cannot simply be deleted (NL2RepoBench's guard). Instead the
evaluation copy is reset the way SWE-bench resets test files: every pytest configuration
item (`gyre.evaluators.pytest_guard`'s list: conftest.py, pytest.ini, tox.ini, setup.cfg
and pyproject.toml pytest sections, sitecustomize, modules shadowing pytest) is removed,
then the base commit's versions of those files are copied back from the query's
pristine starting files, then the hidden tests are copied in LAST. The agent's edits to
any of them are gone; its edits to the code under test stay.

`bash run_tests.sh` runs at the workspace path the images use (`/testbed`), with
PYTEST_ADDOPTS asking for a JUnit report; each test's status is read from the report
(never from console output the code under test could print) and compared with
`expected_output_json`: binary 1.0 iff all match. A test id matches a report node id
exactly or as its trailing `::`-separated part. Timed out: 0 (the agent's hanging code).
No report although the script ended by itself, or an unparsable one: evaluator failure.

Known gap (issue 12, not yet done for this format): the verdict still comes from a JUnit
report written inside the sandbox, so agent code in the test process can forge it; the
NL2RepoBench evaluator already counts over gyre's result channel with canaries
(`gyre.evaluators.channel`, `canaries`, `tally`), and this format moves to it next.
"""


from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from gyre.benchmarks.spec import TaskSpec
from gyre.evaluators.common import JUNIT_FILE, REPORTS_MOUNT, error, ok, pytest_addopts, tail, write_log
from gyre.evaluators.junit import ERROR, FAILED, PASSED, SKIPPED, nodeid, read_junit
from gyre.evaluators.pytest_guard import PLANTED_FILE_NAMES, ROOT_CONFIG_NAMES, neutralise_pytest_config
from gyre.evaluators.workspace_copy import copy_workspace
from gyre.records import Query, Score
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.isolation import Isolation
from gyre.sandboxes.layout import Mount, SandboxLayout
from gyre.sandboxes.paths import clear_path
from gyre.sandboxes.privileges import protect
from gyre.sandboxes.process import sandbox_env

WORKDIR = "/testbed"
_STATUS = {PASSED: "PASSED", FAILED: "FAILED", ERROR: "ERROR", SKIPPED: "SKIPPED"}
CONFIG_NAMES = PLANTED_FILE_NAMES | ROOT_CONFIG_NAMES


def evaluate_r2e(
    query: Query,
    spec: TaskSpec,
    workspace: Path,
    eval_dir: Path,
    execution_id: str,
    timeout_s: float,
    isolation: Isolation,
    limits: SandboxLimits,
) -> Score:
    repo, reports, scratch = eval_dir / "repo", eval_dir / "reports", eval_dir / "tmp"
    too_big = copy_workspace(workspace, repo, limits)
    if too_big is not None:
        return ok(execution_id, 0.0, too_big, total=len(spec.expected_statuses))
    neutralise_pytest_config(repo)
    restored = _restore_pristine_config(Path(query.start_dir), repo) if query.start_dir else 0
    for rel in query.test_files:
        shutil.copyfile(Path(query.hidden_tests_dir) / rel, clear_path(repo, rel))
    reports.mkdir()
    scratch.mkdir()
    isolation.hand_over(repo)
    isolation.hand_over(reports)  # the JUnit report is written inside (see the module docstring's known gap)
    protect(repo, query.test_files)
    workdir = WORKDIR if isolation.bwrap else None  # without bubblewrap: its host path (run_tests.sh must not care)
    layout = SandboxLayout(workdir=workdir, mounts=(Mount(reports, REPORTS_MOUNT, writable=True),) if workdir else
                           (Mount(reports, str(reports), writable=True),))
    junit_inside = f"{REPORTS_MOUNT if workdir else reports}/{JUNIT_FILE}"
    (command,) = query.test_commands
    result = isolation.run(
        command, workspace=repo, scratch=scratch, layout=layout,
        env=sandbox_env(Path(layout.inside(repo)), {"PYTEST_ADDOPTS": pytest_addopts(junit_inside)}),
        limits=limits, timeout_s=timeout_s, interrupt_grace_s=5.0,
    )
    write_log(reports / "command_0.log", command, result)
    junit = reports / JUNIT_FILE
    if not junit.exists():
        if result.timed_out:
            return ok(execution_id, 0.0, f"tests timed out after {timeout_s:g}s before a report",
                      total=len(spec.expected_statuses))
        return error(execution_id, f"{command!r} exited {result.exit_code} without a pytest report: {tail(result)}")
    try:
        statuses = {nodeid(c): _STATUS[c.outcome] for c in read_junit(junit)}
    except ET.ParseError as exc:
        return error(execution_id, f"JUnit report {junit} is unparsable: {exc}")
    mismatches = []
    for test, expected in spec.expected_statuses.items():
        got = _status_of(test, statuses)
        if got != expected:
            mismatches.append(f"{test}: expected {expected}, got {got or 'not run'}")
    num_ok = len(spec.expected_statuses) - len(mismatches)
    detail = f"{num_ok}/{len(spec.expected_statuses)} tests as expected; restored {restored} config files"
    if mismatches:
        detail += "; " + "; ".join(mismatches[:5])
    return ok(execution_id, 0.0 if mismatches else 1.0, detail, passed=num_ok, total=len(spec.expected_statuses))


def _restore_pristine_config(pristine: Path, repo: Path) -> int:
    """Copy the base commit's pytest configuration files back over the evaluation copy."""
    count = 0
    for path in pristine.rglob("*"):
        rel = path.relative_to(pristine)
        if rel.parts[0] == ".git" or path.name not in CONFIG_NAMES or not path.is_file() or path.is_symlink():
            continue
        shutil.copyfile(path, clear_path(repo, rel.as_posix()))
        count += 1
    return count


def _status_of(test: str, statuses: dict[str, str]) -> str | None:
    if test in statuses:
        return statuses[test]
    matches = [status for node, status in statuses.items() if node.endswith("::" + test)]
    return matches[0] if len(matches) == 1 else None
