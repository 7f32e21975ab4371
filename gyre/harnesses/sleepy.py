"""The `sleepy` harness: real model calls through the proxy, most of the time spent waiting.

A systems-benchmark load, not an agent. Each execution makes `calls` OpenAI chat completions
through the proxy with its own key (`model_client.py`, agent `main`: the calls extend each
other's prefix, one trajectory), and after each call waits `duration / calls`, where
`duration` is what the simulator draws for this execution of the configured workload, scaled
from hours to seconds: the runtime hands the harness that draw as a function of the
execution's slot (`gyre.runtime.simulated_durations`), so this room never imports the simulator. So an execution lasts its drawn duration plus
the time its calls take (a call slowed or stalled by the engines lengthens it, as a stall does
in the simulator), and a real run shows the workload's long tail in minutes. The same
execution (seed, group, index in group) waits the same under every scheduler policy.

It writes nothing to the workspace; the evaluator scores what it finds there (0 for an
untouched tiny query). The outcome's status is the simulator's end for the draw (completed,
harness_timeout or overall_timeout), unless the run's own harness deadline comes first: then
it stops there and reports harness_timeout. Executions outside a training group (evaluation
rounds) make their calls without waiting.

Engine-bound, on a paced engine (`rollout.engine: paced`, whose cells release tokens on a
modelled accelerator's clock): the runtime hands over, with the draw, the tokens whose modelled
decode is the drawn duration, and the execution makes its calls back to back until they are
sampled, waiting for nothing else. Its time is then the engines' time, as in the simulator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gyre.harnesses.base import ExecutionSlot, HarnessOutcome, ModelEndpoint
from gyre.harnesses.model_client import ModelClient
from gyre.harnesses.subagents import MAIN_AGENT_ID
from gyre.records import ExecutionStatus, Query
from gyre.sandboxes.base import Sandbox


@dataclass(frozen=True)
class SleepyDraw:
    wall_s: float
    """Wall-clock seconds the execution should take (simulated hours x scale)."""
    simulated_h: float
    """The simulator's duration in hours."""
    status: ExecutionStatus
    """How the simulator ends it: completed, harness_timeout or overall_timeout."""
    tokens: int | None = None
    """Engine-bound (a paced engine, `rollout.engine: paced`): the output tokens whose modelled
    decode is the drawn duration. The calls then carry the duration themselves, back to back with
    no wait: a call slowed by a crowded cell lengthens the execution as a stall does in the
    simulator. None: the duration is waited out between the calls."""


Durations = Callable[[ExecutionSlot], SleepyDraw]
"""An execution's slot -> how long it waits and how it ends."""

SYSTEM_PROMPT = "You are an agent whose tools take a long time. Reply briefly after each wait."


def _wait_note(seconds: float) -> str:
    return f"waited {seconds:.1f} s; continue."


class SleepyHarness:
    name = "sleepy"

    def __init__(self, durations: Durations, calls: int, max_tokens: int | None = None) -> None:
        if calls <= 0:
            raise ValueError(f"harness.sleepy_calls must be > 0, got {calls}")
        self.durations = durations
        self.calls = calls
        self.max_tokens = max_tokens

    def run(self, query: Query, sandbox: Sandbox, endpoint: ModelEndpoint, deadline_s: float,
            slot: ExecutionSlot | None = None) -> HarnessOutcome:
        if slot is None:
            raise ValueError("the sleepy harness needs the execution's slot (group and index) to draw its duration")
        planned = self.durations(slot)
        if planned.tokens is not None:
            return self._engine_bound(query, endpoint, deadline_s, planned)
        wait_s = planned.wall_s / self.calls
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": query.instruction},
        ]
        with ModelClient(endpoint, self.max_tokens) as client:
            for turn in range(self.calls):
                response = client.chat(messages, [], MAIN_AGENT_ID, deadline_s)
                if response is None:
                    return HarnessOutcome(ExecutionStatus.harness_timeout, turn)
                messages += _continuation(response["choices"][0]["message"], wait_s)
                if not _sleep_until(time.monotonic() + wait_s, deadline_s):
                    return HarnessOutcome(ExecutionStatus.harness_timeout, turn + 1)
        return HarnessOutcome(planned.status, self.calls)


    def _engine_bound(self, query: Query, endpoint: ModelEndpoint, deadline_s: float,
                      planned: SleepyDraw) -> HarnessOutcome:
        """Calls back to back until the planned tokens are sampled: `calls` calls sharing them
        equally, and more while the model ended some early (end of turn before its cap)."""
        left = planned.tokens
        per_call = -(-left // self.calls)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": query.instruction},
        ]
        turn = 0
        with ModelClient(endpoint, self.max_tokens) as client:
            while left > 0:
                response = client.chat(messages, [], MAIN_AGENT_ID, deadline_s, max_tokens=min(left, per_call))
                if response is None:
                    return HarnessOutcome(ExecutionStatus.harness_timeout, turn)
                turn += 1
                left -= max(1, int((response.get("usage") or {}).get("completion_tokens", 0)))
                messages += _continuation(response["choices"][0]["message"], 0.0)
        return HarnessOutcome(planned.status, turn)


def _continuation(message: dict[str, Any], wait_s: float) -> list[dict[str, Any]]:
    """The model's reply as returned (so the next prompt extends this one's exact tokens) and the
    note that the wait is over: a tool result for each tool call it made, else a user turn."""
    calls = message.get("tool_calls") or []
    if not calls:
        return [message, {"role": "user", "content": _wait_note(wait_s)}]
    return [message] + [{"role": "tool", "tool_call_id": tc.get("id", ""), "content": _wait_note(wait_s)}
                        for tc in calls]


def _sleep_until(wake_s: float, deadline_s: float) -> bool:
    """Sleep until `wake_s` (time.monotonic); False when the deadline comes first (slept until it)."""
    if wake_s > deadline_s:
        time.sleep(max(0.0, deadline_s - time.monotonic()))
        return False
    time.sleep(max(0.0, wake_s - time.monotonic()))
    return True
