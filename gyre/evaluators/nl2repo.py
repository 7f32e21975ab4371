"""Score an execution's kept workspace on an NL2RepoBench-style query's hidden tests.

Score = min(passed hidden test cases / query.test_case_count, 1.0), as NL2RepoBench
scores. The evaluation never touches the kept workspace; it works in a fresh `eval_dir`,
kept afterwards for inspection:

    eval_dir/repo/                 copy of the workspace, cleaned, hidden tests copied in last
    eval_dir/reports/junit_<i>.xml JUnit report of test command i
    eval_dir/reports/command_<i>.log   its exit code, timing, stdout and stderr
    eval_dir/reports/neutralised.txt   what was removed from the copy (if anything)
    eval_dir/score.json            the returned Score

Steps: copy the workspace; remove pytest configuration and code the agent could use to
force passes (`gyre.evaluators.pytest_guard`); copy the pristine hidden tests in LAST,
replacing any agent edits to those files (symlinks on their way are replaced, never
followed); pin pytest's rootdir with gyre's own pytest.ini; run each test command with
`bash -c` in `repo/` in a fresh sandbox (`gyre.sandboxes.isolation`: bubblewrap + cgroups
where available, so the agent's code under test has no network and sees no other
workspace; scrubbed environment, rlimits, `timeout_s` per command, only `repo/`,
`reports/` and a scratch `/tmp` writable), with PYTEST_ADDOPTS asking for
a JUnit report and `--continue-on-collection-errors` (one test file that fails to import
does not cost the others); count test cases that passed in the reports. Only cases from
the hidden test files count, each once across commands, so tests the agent wrote itself
earn nothing. Test commands must run pytest.

Rules: who failed decides the status.
- The agent's code failed: a test fails or errors (assertion, exception, ImportError or
  SyntaxError at collection time, shown as errors in the report). That is a valid score,
  possibly 0.0.
- A test command timed out: also the agent's fault (a hanging solution). At the timeout
  the process group gets SIGINT, so pytest still writes its report, and SIGKILL a few
  seconds later; the score counts what passed before, and `detail` says it timed out. If
  no report was written even so, that command's tests count as not passed.
- The evaluator failed: no report although the command ended by itself, an unparsable
  report, pytest exit code 3 (internal error), 4 (usage error) or 5 (no tests collected:
  the hidden tests are pristine, so the benchmark or the command is broken), 126/127
  (command not executable / not found), or any exception raised here. Then the result is
  Score(status=error, score=None, detail=what went wrong): dropped from its group,
  NEVER a zero.

Known gap: code under test that kills pytest before it writes a report (os._exit at
import) is scored as an evaluator failure, i.e. dropped rather than zero.
"""

from __future__ import annotations

import shlex
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path, PurePosixPath

from gyre.evaluators.deadline import capped, overall_timeout_error
from gyre.evaluators.junit import PASSED, read_junit
from gyre.evaluators.pytest_guard import neutralise_pytest_config, pin_rootdir
from gyre.records import EvalStatus, Query, Score
from gyre.sandboxes.base import ExecResult, SandboxLimits
from gyre.sandboxes.isolation import Isolation
from gyre.sandboxes.layout import Mount, SandboxLayout
from gyre.sandboxes.paths import clear_path
from gyre.sandboxes.process import sandbox_env
from gyre.evaluators.workspace_copy import copy_workspace

EVAL_LIMITS = SandboxLimits(max_output_bytes=256 * 1024)
INTERRUPT_GRACE_S = 5.0
"""Seconds between SIGINT (pytest writes its report) and SIGKILL for a timed-out test command."""
EVALUATOR_FAILURE_EXIT_CODES = {
    3: "pytest internal error",
    4: "pytest usage error",
    5: "no tests collected",
    126: "command not executable",
    127: "command not found",
}
SCORE_FILE = "score.json"
_TAIL_CHARS = 600


def evaluate(
    query: Query,
    workspace: Path,
    eval_dir: Path,
    execution_id: str,
    timeout_s: float = 120,
    *,
    isolation: Isolation | None = None,
    limits: SandboxLimits = EVAL_LIMITS,
    deadline_s: float | None = None,
) -> Score:
    """Run `query`'s hidden tests against a copy of `workspace` in the fresh directory `eval_dir`.

    `eval_dir` must not exist (FileExistsError): each evaluation, reruns included, gets
    its own. `timeout_s` bounds each test command, `deadline_s` (the execution's overall
    deadline, time.monotonic) all of them: a command it cuts makes an `overall_timeout`
    evaluator failure (`gyre.evaluators.evaluate_query` labels it).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    eval_dir = Path(eval_dir).resolve()  # commands run inside eval_dir/repo: paths must be absolute
    eval_dir.mkdir(parents=True, exist_ok=False)
    try:
        isolation = isolation or Isolation.detect()
        score = _score(query, Path(workspace).resolve(), eval_dir, execution_id, timeout_s, isolation, limits,
                       deadline_s)
    except Exception as exc:  # an evaluator failure must become a recorded error, never a zero
        score = _error(execution_id, f"evaluator failed: {type(exc).__name__}: {exc}")
    (eval_dir / SCORE_FILE).write_text(score.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return score


def _score(
    query: Query,
    workspace: Path,
    eval_dir: Path,
    execution_id: str,
    timeout_s: float,
    isolation: Isolation,
    limits: SandboxLimits,
    deadline_s: float | None = None,
) -> Score:
    repo = eval_dir / "repo"
    reports = eval_dir / "reports"
    scratch = eval_dir / "tmp"
    too_big = copy_workspace(workspace, repo, limits)
    if too_big is not None:  # the agent's doing: a valid zero, never a dropped sample
        return Score(execution_id=execution_id, status=EvalStatus.ok, score=0.0, tests_passed=0,
                     tests_total=query.test_case_count, detail=too_big)
    neutralised = neutralise_pytest_config(repo)
    for rel in query.test_files:
        shutil.copyfile(Path(query.hidden_tests_dir) / rel, clear_path(repo, rel))
    pin_rootdir(repo, query.test_files)
    reports.mkdir()
    scratch.mkdir()
    layout = SandboxLayout(mounts=(Mount(reports, str(reports), writable=True),))
    if neutralised:
        (reports / "neutralised.txt").write_text("\n".join(neutralised) + "\n", encoding="utf-8")

    hidden_files = {PurePosixPath(rel).as_posix() for rel in query.test_files}
    passed: set[tuple[str, str, str]] = set()
    num_ignored = 0
    notes: list[str] = []
    for i, command in enumerate(query.test_commands):
        command_timeout_s = capped(timeout_s, deadline_s)
        if command_timeout_s <= 0:
            return overall_timeout_error(execution_id, f"no time left for test command {i}")
        junit = reports / f"junit_{i}.xml"
        addopts = f"--junitxml={shlex.quote(str(junit))} -o junit_family=xunit1 --continue-on-collection-errors"
        result = isolation.run(
            command,
            workspace=repo,
            scratch=scratch,
            layout=layout,
            env=sandbox_env(repo, {"PYTEST_ADDOPTS": addopts}),
            limits=limits,
            timeout_s=command_timeout_s,
            interrupt_grace_s=INTERRUPT_GRACE_S,
        )
        _write_log(reports / f"command_{i}.log", command, result)
        failure = _evaluator_failure(i, command, result, junit)
        if failure is not None:
            return _error(execution_id, failure)
        if not junit.exists():  # timed out and killed before pytest could write its report
            notes.append(f"command {i} timed out after {command_timeout_s:g}s before pytest wrote a report: none counted")
            continue
        try:
            cases = read_junit(junit)
        except ET.ParseError as exc:
            return _error(execution_id, f"command {i}: JUnit report {junit} is unparsable: {exc}")
        for case in cases:
            if case.outcome != PASSED:
                continue
            if case.file in hidden_files:
                passed.add((case.file, case.classname, case.name))
            else:
                num_ignored += 1
        if result.timed_out:
            notes.append(f"command {i} timed out after {command_timeout_s:g}s: counted what passed before")

    num_passed = len(passed)
    detail = [f"{num_passed}/{query.test_case_count} hidden test cases passed", *notes]
    if num_ignored:
        detail.append(f"ignored {num_ignored} passing test cases outside the hidden test files")
    if neutralised:
        detail.append(f"neutralised {len(neutralised)} pytest config items (reports/neutralised.txt)")
    return Score(
        execution_id=execution_id,
        status=EvalStatus.ok,
        score=min(num_passed / query.test_case_count, 1.0),
        tests_passed=num_passed,
        tests_total=query.test_case_count,
        detail="; ".join(detail),
    )


def _evaluator_failure(i: int, command: str, result: ExecResult, junit: Path) -> str | None:
    """Why command i's run says the evaluator (not the agent) failed, or None."""
    if result.timed_out:
        return None
    meaning = EVALUATOR_FAILURE_EXIT_CODES.get(result.exit_code)
    if meaning is not None:
        return f"command {i} {command!r} exited {result.exit_code} ({meaning}): {_tail(result)}"
    if not junit.exists():
        return f"command {i} {command!r} exited {result.exit_code} without writing {junit}: {_tail(result)}"
    return None


def _write_log(path: Path, command: str, result: ExecResult) -> None:
    path.write_text(
        f"command: {command}\nexit_code: {result.exit_code}\ntimed_out: {result.timed_out}\n"
        f"duration_s: {result.duration_s:.3f}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}\n",
        encoding="utf-8",
    )


def _tail(result: ExecResult) -> str:
    return (result.stderr.strip() or result.stdout.strip() or "(no output)")[-_TAIL_CHARS:]


def _error(execution_id: str, detail: str) -> Score:
    return Score(execution_id=execution_id, status=EvalStatus.error, score=None, detail=detail)
