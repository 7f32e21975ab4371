"""An evaluation inside the execution's overall budget: capped commands, a distinct failure.

The overall timeout bounds the whole execution, evaluation included
(`gyre.harnesses.timeouts`). An evaluation that cannot start, or is still running, at that
deadline did not fail because of the agent: it is an evaluator failure (dropped from its
group, retryable later with a fresh budget), never a zero, and its detail starts with
`overall_timeout` so it is told apart from a crash. Test commands are cut at the deadline
(plus the grace pytest gets to write its report), so their timeouts never stretch it.
"""

from __future__ import annotations

import time

from gyre.records import EvalStatus, Score

OVERALL_TIMEOUT = "overall_timeout"


def overall_timeout_error(execution_id: str, why: str) -> Score:
    return Score(execution_id=execution_id, status=EvalStatus.error, score=None, detail=f"{OVERALL_TIMEOUT}: {why}")


def capped(timeout_s: float, deadline_s: float | None) -> float:
    """`timeout_s`, or less when the deadline comes first (<= 0: already past)."""
    return timeout_s if deadline_s is None else min(timeout_s, deadline_s - time.monotonic())


def past(deadline_s: float | None) -> bool:
    return deadline_s is not None and time.monotonic() >= deadline_s
