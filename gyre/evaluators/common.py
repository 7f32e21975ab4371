"""Pieces every format's evaluator shares: score constructors, command logs, the report mount.

Kept apart so each format's module reads as its scoring rule only.
"""

from __future__ import annotations

from pathlib import Path

from gyre.records import EvalStatus, Score
from gyre.sandboxes.base import ExecResult, SandboxLimits

SCORE_FILE = "score.json"
EVAL_LIMITS = SandboxLimits(max_output_bytes=256 * 1024)
"""An evaluation's sandbox limits: the default ones with a larger output capture."""
TAIL_CHARS = 600


def ok(execution_id: str, score: float, detail: str, passed: int = 0, total: int = 1) -> Score:
    return Score(execution_id=execution_id, status=EvalStatus.ok, score=score, tests_passed=passed,
                 tests_total=total, detail=detail)


def tampering(execution_id: str, evidence: list[str]) -> Score:
    """The evaluation caught the workspace forging its result: 0, with the evidence."""
    return Score(execution_id=execution_id, status=EvalStatus.tampering, score=0.0,
                 detail="tampering: " + "; ".join(evidence[:3]), evidence=evidence[:50])


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
