"""Pieces every format's evaluator shares: score constructors, command logs, the report mount.

Kept apart so each format's module reads as its scoring rule only. `REPORTS_MOUNT` is
where a container-style task's JUnit report is written inside the evaluation sandbox
(a writable mount of `eval_dir/reports`), outside anything the task itself uses.
"""

from __future__ import annotations

from pathlib import Path

from gyre.records import EvalStatus, Score
from gyre.sandboxes.base import ExecResult

REPORTS_MOUNT = "/gyre-reports"
JUNIT_FILE = "junit.xml"
SCORE_FILE = "score.json"
TAIL_CHARS = 600


def pytest_addopts(junit_path: str) -> str:
    return f"--junitxml={junit_path} -o junit_family=xunit1 -p no:cacheprovider"


def ok(execution_id: str, score: float, detail: str, passed: int = 0, total: int = 1) -> Score:
    return Score(execution_id=execution_id, status=EvalStatus.ok, score=score, tests_passed=passed,
                 tests_total=total, detail=detail)


def error(execution_id: str, detail: str) -> Score:
    """An evaluator failure: dropped from the group, never a zero."""
    return Score(execution_id=execution_id, status=EvalStatus.error, score=None, detail=detail)


def write_log(path: Path, command: str, result: ExecResult) -> None:
    path.write_text(
        f"command: {command}\nexit_code: {result.exit_code}\ntimed_out: {result.timed_out}\n"
        f"limit_hit: {result.limit_hit}\nduration_s: {result.duration_s:.3f}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}\n",
        encoding="utf-8",
    )


def tail(result: ExecResult) -> str:
    return (result.stderr.strip() or result.stdout.strip() or "(no output)")[-TAIL_CHARS:]
