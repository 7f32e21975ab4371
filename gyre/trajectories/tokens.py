"""One recorded call as numpy arrays: the trajectory processor's input, checked once.

The proxy records `records.Call` (pydantic, lists of ints) because it crosses process and
storage boundaries. The processor works on token arrays: a 1M-token execution is
hundreds of calls whose prompts re-send the same history, and Python lists of that size
cost seconds and gigabytes. `CallTokens` is the inside form: int32 ids, float32
behaviour log-probs, and the few facts the classifier reads (agent id, start time,
finish reason). Prompt arrays may be views into one shared buffer (the synthetic
generator does that), so memory stays O(unique tokens) even before the tree exists.

Everything wrong with one call is a `CallInputError` naming the call: mismatched
token/log-prob lengths, an empty prompt (the first output token would have no context to
be scored in), negative ids, log-probs that are not finite or are above 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np

from gyre.records import Call


class CallInputError(ValueError):
    """A recorded call cannot be trained on; the message names the call and the problem."""


@dataclass(frozen=True)
class CallTokens:
    call_id: str
    execution_id: str
    prompt_ids: np.ndarray  # int32 [P]
    output_ids: np.ndarray  # int32 [O]
    logprobs: np.ndarray  # float32 [O], behaviour log-prob of each output id
    policy_version: int = 0
    agent_id: str | None = None
    started_at: float = 0.0  # seconds; only the order matters
    finish_reason: str = "stop"

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


# Behaviour log-probs come from a softmax; allow float rounding just above 0.
_LOGPROB_SLACK = 1e-4


def check_call(call: CallTokens) -> CallTokens:
    """Return `call` if it can be trained on, else raise `CallInputError`."""
    name = f"call {call.call_id!r} of execution {call.execution_id!r}"
    if call.prompt_ids.ndim != 1 or call.output_ids.ndim != 1 or call.logprobs.ndim != 1:
        raise CallInputError(f"{name}: token and log-prob arrays must be one-dimensional")
    if len(call.output_ids) != len(call.logprobs):
        raise CallInputError(
            f"{name}: {len(call.output_ids)} output ids but {len(call.logprobs)} behaviour log-probs"
        )
    if len(call.prompt_ids) == 0:
        raise CallInputError(f"{name}: empty prompt (its first output token has no context to score)")
    if (call.prompt_ids.size and call.prompt_ids.min() < 0) or (call.output_ids.size and call.output_ids.min() < 0):
        raise CallInputError(f"{name}: negative token id")
    if call.logprobs.size:
        if not np.isfinite(call.logprobs).all():
            raise CallInputError(f"{name}: behaviour log-probs must be finite")
        if call.logprobs.max() > _LOGPROB_SLACK:
            raise CallInputError(f"{name}: behaviour log-prob {float(call.logprobs.max())} is above 0")
    return call


def _seconds(t: datetime | float) -> float:
    return t.timestamp() if isinstance(t, datetime) else float(t)


def from_call(call: Call) -> CallTokens:
    """The numpy form of a proxy-recorded call (`build_tree` checks it)."""
    return (
        CallTokens(
            call_id=call.call_id,
            execution_id=call.execution_id,
            prompt_ids=np.asarray(call.prompt_ids, dtype=np.int32),
            output_ids=np.asarray(call.output_ids, dtype=np.int32),
            logprobs=np.asarray(call.logprobs, dtype=np.float32),
            policy_version=call.policy_version,
            agent_id=call.agent_id,
            started_at=_seconds(call.started_at),
            finish_reason=call.finish_reason,
        )
    )


def as_call_tokens(calls: list[Call] | list[CallTokens]) -> list[CallTokens]:
    return [from_call(c) if isinstance(c, Call) else c for c in calls]
