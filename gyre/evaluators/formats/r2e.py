"""Score R2E-Gym / DeepSWE instances: every listed test must end with its expected status.

The agent edited a real repository, whose own `conftest.py` and pytest configuration are
legitimate, so they cannot simply be deleted (NL2RepoBench's guard). Instead the
evaluation copy is reset the way SWE-bench resets test files: every pytest configuration
item (`gyre.evaluators.integrity.pytest_guard`'s list: conftest.py, pytest.ini, tox.ini, setup.cfg
and pyproject.toml pytest sections, sitecustomize, modules shadowing pytest) is removed,
then the base commit's versions of those files are copied back from the query's
pristine starting files, then the hidden tests are copied in LAST. The agent's edits to
any of them are gone; its edits to the code under test stay.

`bash run_tests.sh` runs at the workspace path the images use (`/testbed`), with gyre's
result plugin (`observed`, `channel`): each test's status comes over a pipe gyre owns,
never from a file or console output the code under test could write. It runs twice, each run on a
fresh copy holding its variant of the hidden tests (`observed.run_pair`, `mutants`: a passing mutant
is tampering); each test's status is read from the run where it is not mutated. Upstream's rule (R2E-Gym's grading): a
test's key is its node id's parts after the file joined by "." (`TestAdd.test_one`);
the instance is solved (1.0) iff the number of parsed hidden tests equals the expected
map's and every expected test ends with its expected status; otherwise 0. An expected key
also matches the `::` form or the whole node id (rows written by other tools). Once pytest
started, a timeout or a dead process is the workspace's 0; a script that ended without
starting pytest is an evaluator failure, unless it starts pytest on the base commit's files
(`control`: then the workspace broke it, a 0).
"""


from __future__ import annotations

import random
import secrets
import shutil
from pathlib import Path

from gyre.benchmarks.r2e import WORKDIR
from gyre.benchmarks.spec import TaskSpec
from gyre.evaluators.common import ok, tail, write_log
from gyre.evaluators.environments.needs import task_plugins
from gyre.evaluators.environments.workspace_copy import copy_workspace
from gyre.evaluators.integrity.pristine import PristineFile, test_id
from gyre.evaluators.integrity.channel import TestResult
from gyre.evaluators.integrity.control import no_verdict
from gyre.evaluators.integrity.pytest_guard import PLANTED_FILE_NAMES, ROOT_CONFIG_NAMES, neutralise_pytest_config
from gyre.evaluators.observed import IndexAccess, Observed, Observer
from gyre.evaluators.paired import plan_pristine, read_sources, retire, write_pristine
from gyre.records import Query, Score
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.layout import SandboxLayout
from gyre.sandboxes.local.isolation import Isolation
from gyre.sandboxes.local.privileges import protect
from gyre.sandboxes.paths import clear_path
from gyre.sandboxes.process import sandbox_env

_STATUS = {"passed": "PASSED", "failed": "FAILED", "error": "ERROR", "skipped": "SKIPPED"}
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
    index: IndexAccess | None = None,
) -> Score:
    repo, reports, scratch = eval_dir / "repo", eval_dir / "reports", eval_dir / "tmp"
    total = len(spec.expected_statuses)
    too_big = copy_workspace(workspace, repo, limits)
    if too_big is not None:
        return ok(execution_id, 0.0, too_big, total=total)
    workdir = WORKDIR if isolation.bwrap else None  # without bubblewrap: its host path (run_tests.sh must not care)
    inside = workdir or str(repo)
    pristine = plan_pristine(read_sources(Path(query.hidden_tests_dir), query.test_files), inside,
                             random.Random(secrets.randbits(64)))
    reports.mkdir()
    scratch.mkdir()
    observer = Observer.create(eval_dir, isolation, index, plugin_dists=task_plugins(query))
    layout = SandboxLayout(workdir=workdir, mounts=observer.mounts())
    (command,) = query.test_commands
    restored = 0

    def place(run: int) -> dict:
        nonlocal restored
        if run:  # a fresh copy and scratch space at the same paths
            retire(eval_dir, run - 1, ("repo", "tmp"))
            copy_workspace(workspace, repo, limits)
            scratch.mkdir()
        neutralise_pytest_config(repo)
        restored = _restore_pristine_config(Path(query.start_dir), repo) if query.start_dir else 0
        write_pristine(repo, pristine, run)
        # upstream's run_tests.sh runs `.venv/bin/python -m pytest`: the evaluation's own environment,
        # never one the agent left in the workspace (a fake `python` there would decide the result)
        clear_path(repo, ".venv").symlink_to(observer.env.inside)
        isolation.hand_over(repo)
        protect(repo, query.test_files)
        return dict(workspace=repo, scratch=scratch, layout=layout, env=sandbox_env(Path(layout.inside(repo))),
                    limits=limits, timeout_s=timeout_s)

    seen = observer.run_pair(command, pristine, place)
    for run, result in enumerate(seen.runs):
        write_log(reports / f"command_0{'' if run == 0 else f'.run{run}'}.log", command, result)
    return r2e_verdict(execution_id, spec, seen, pristine, command, timeout_s,
                       f"restored {restored} config files")


def r2e_verdict(execution_id: str, spec: TaskSpec, seen: Observed, pristine: list[PristineFile], command: str,
                timeout_s: float, note: str = "") -> Score:
    """Upstream's rule on what gyre's plugin saw (`seen`) of the hidden test modules (`pristine`): 1.0 iff as
    many hidden tests were parsed as the expected map holds and each ended with its expected status; a script
    that never started pytest is `no_verdict` (a timeout before it, the workspace's 0). The same for an
    evaluation copy (`evaluate_r2e`) and the agent's own container (`in_container`)."""
    result, said = seen.result, seen.said
    total = len(spec.expected_statuses)
    if (verdict := seen.settled(execution_id)) is not None:
        return seen.flagged(verdict)
    if not said.hello:
        if result.timed_out:
            return seen.flagged(ok(execution_id, 0.0, f"tests timed out after {timeout_s:g}s before pytest started",
                                   total=total))
        why = f"{command!r} exited {result.exit_code} without starting pytest: {tail(result)}"
        return seen.flagged(no_verdict(execution_id, why))
    files = {f.inside: f for f in pristine}
    statuses = {r.nodeid: _status(r) for channel in seen.channels for r in channel.results.values()
                if r.path in files and files[r.path].scoring_run(test_id(r.nodeid)) == channel.run}
    mismatches = []
    for test, expected in spec.expected_statuses.items():
        got = _status_of(test, statuses)
        if got != expected:
            mismatches.append(f"{test}: expected {expected}, got {got or 'not run'}")
    num_ok = total - len(mismatches)
    detail = f"{num_ok}/{total} tests as expected" + (f"; {note}" if note else "")
    parsed = _parsed_count(statuses, spec.expected_statuses)
    if parsed != total:
        mismatches.append(f"parsed {parsed} hidden tests, the expected map has {total} (upstream scores 0)")
    if mismatches:
        detail += "; " + "; ".join(mismatches[:5])
    return seen.flagged(ok(execution_id, 0.0 if mismatches else 1.0, detail, passed=num_ok, total=total))


def _parsed_count(statuses: dict[str, str], expected: dict[str, str]) -> int:
    """How many keys upstream's log parse would give: its `parse_log_pytest` keys only the short summary's PASSED,
    FAILED and ERROR lines, so a skipped test (`SKIPPED [1] file:line: reason`, an xfail) is no key. A SKIPPED
    expectation (rows written by other tools) still counts the test it names."""
    named = {t for t, status in expected.items() if status == "SKIPPED" and _status_of(t, statuses) == "SKIPPED"}
    return sum(status != "SKIPPED" for status in statuses.values()) + len(named)


def _status(result: TestResult) -> str:
    """Upstream's status word; a test that started but never finished its call (the process died) failed."""
    if result.outcome == "passed" and "call" not in result.phases:
        return "FAILED"
    return _STATUS[result.outcome]


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
    """The status of expected key `test`: upstream's dotted key, the `::` form, or the whole node id."""
    for node, status in statuses.items():
        after_file = node.split("::")[1:]
        if test in (node, "::".join(after_file), ".".join(after_file)):
            return status
    return None
