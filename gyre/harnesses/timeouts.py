"""The two timeouts of an execution, kept separate as in the paper.

- The **harness timeout** bounds the agent: past it the harness is stopped, the execution
  ends as `harness_timeout`, and its kept workspace is scored like any other (partial
  artifacts; the paper: 6.25 % of NL2RepoBench rollouts end so).
- The **overall timeout** bounds the whole execution: sandbox, harness, waiting for an
  evaluation slot, and evaluation (the paper: 0.87 %). The harness is stopped
  `evaluation_reserve_s` before it, so the workspace can still be scored inside the
  budget; an execution stopped that way ends as `overall_timeout` (and is scored). The
  evaluation always keeps its reserve, whatever the harness did: its deadline is the overall
  one or the reserve from its start, whichever is later (`Timeouts.evaluation_deadline`; a
  harness that overran its stop left the tests no time before). An evaluation still running
  at that deadline is cut there and recorded as an evaluator failure whose detail starts with
  `overall_timeout` (dropped from its group, retryable with a fresh budget, never a zero):
  `gyre.evaluators.evaluate_query(deadline_s=)`.

A format's own agent timeout (Terminal-Bench's `max_agent_timeout_sec`) tightens the
harness timeout. Deadlines are `time.monotonic()` values of the process that runs the
execution and its evaluation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gyre.config.run import RunConfig
from gyre.records import ExecutionStatus


@dataclass(frozen=True)
class Deadlines:
    harness_s: float
    """When the harness is stopped."""
    overall_s: float | None
    """When everything of the execution, evaluation included, must be done; None: unbounded."""
    harness_cut_by_overall: bool
    """The harness deadline is the overall one's (less the evaluation reserve), not its own."""

    def status(self, harness_status: ExecutionStatus) -> ExecutionStatus:
        """The execution's status: a harness timeout that the overall budget forced is `overall_timeout`."""
        if harness_status is ExecutionStatus.harness_timeout and self.harness_cut_by_overall:
            return ExecutionStatus.overall_timeout
        return harness_status


@dataclass(frozen=True)
class Timeouts:
    harness_s: float
    overall_s: float | None = None
    evaluation_reserve_s: float = 0.0

    def __post_init__(self) -> None:
        if self.overall_s is not None and self.overall_s <= self.evaluation_reserve_s:
            raise ValueError(
                f"harness.overall_timeout_s={self.overall_s:g} leaves the harness no time: it must exceed the "
                f"{self.evaluation_reserve_s:g} s kept for evaluation (evaluator.timeout_s)"
            )

    def start(self, agent_timeout_s: float | None = None, now: float | None = None) -> Deadlines:
        """Deadlines of an execution starting `now` (default: this instant)."""
        now = time.monotonic() if now is None else now
        harness = now + min(self.harness_s, agent_timeout_s or float("inf"))
        if self.overall_s is None:
            return Deadlines(harness, None, False)
        overall = now + self.overall_s
        stop_for_overall = overall - self.evaluation_reserve_s
        return Deadlines(min(harness, stop_for_overall), overall, stop_for_overall < harness)


    def evaluation_deadline(self, overall_s: float | None, now: float | None = None) -> float | None:
        """When an evaluation starting `now` must end: the overall deadline, but never less than the reserve
        from now. A harness (or a sandbox teardown) that overran its stop cannot leave the evaluation no time:
        that would turn the workspace's score into an `overall_timeout` failure, a dropped sample."""
        if overall_s is None:
            return None
        return max(overall_s, (time.monotonic() if now is None else now) + self.evaluation_reserve_s)


def execution_timeouts(config: RunConfig) -> Timeouts:
    """A run's timeouts; ValueError when the overall budget leaves the harness no time."""
    return Timeouts(config.harness.harness_timeout_s, config.harness.overall_timeout_s, config.evaluator.timeout_s)
