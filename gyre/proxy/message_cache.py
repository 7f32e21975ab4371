"""Validate a growing conversation once: each request of an execution checks only its new messages.

An agent resends its whole conversation on every call, so the k-th request carries the k - 1
before it plus what is new (a tool result, the model's last turn). Validating every message
of a 50k-token conversation on each call (pydantic, on the event loop) was the largest share
of the GIL the proxy holds at 32 concurrent executions (`gyre bench proxy-echo`, py-spy
`--gil`). Here each execution keeps the raw messages (as `orjson` parsed them) of its last
few conversations and the models they validated to; a request reuses the models of its
longest equal prefix (dict equality: C-speed, the strings compared by length and bytes) and
validates the rest. Only equal raw messages are ever reused, so a changed, removed or
reordered message is validated again; the result is what validating the whole list would
give. (Values that are equal but not identical, 1 and 1.0 and True, cannot change a message
here: its fields are strings, and unknown fields are kept only to be ignored.)

A derived form of each message (the chat-template dict of the OpenAI front end) can ride
along: computed once per new message, reused with its model.

Conversations are kept per execution, at most `MAX_CONVERSATIONS` (an execution's main agent
and a subagent interleave calls on one key), and go with the execution's session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from gyre.proxy.errors import validation_problem

MAX_CONVERSATIONS = 2
"""Conversations remembered per execution (the most recently used ones)."""

M = TypeVar("M")


class MessageError(ValueError):
    """Message `index` of the request is invalid; the message names its best-fitting error
    (`errors.validation_problem`)."""

    def __init__(self, index: int, exc: ValidationError) -> None:
        self.index = index
        super().__init__(validation_problem(exc, ("messages", index)) or f"messages.{index}: bad input")


@dataclass(frozen=True)
class _Conversation(Generic[M]):
    kind: str
    raw: list[Any]
    models: list[M]
    derived: list[Any]


class MessageCache(Generic[M]):
    """One execution's recent conversations: raw messages -> validated models (and derived forms)."""

    def __init__(self) -> None:
        self._recent: list[_Conversation[M]] = []
        self._lock = threading.Lock()
        self.validated = 0
        """Messages validated so far (the rest were reused): what the tests and benchmark read."""

    def messages(self, kind: str, raw: list[Any], adapter: TypeAdapter[M],
                 derive: Callable[[M], Any] | None = None) -> tuple[list[M], list[Any]]:
        """The models of `raw` (and `derive` of each, or [] without it), validating only the
        messages past the longest prefix equal to a remembered conversation of the same `kind`
        (one `adapter` and `derive` per kind: an OpenAI message never stands in for an
        Anthropic one). Raises `MessageError` for the first invalid message."""
        with self._lock:
            recent = [c for c in self._recent if c.kind == kind]
        best, reused = None, 0
        for conversation in recent:
            n = common_prefix(raw, conversation.raw)
            if n > reused:
                best, reused = conversation, n
        models = best.models[:reused] if best is not None else []
        derived = best.derived[:reused] if best is not None and derive is not None else []
        for i in range(reused, len(raw)):
            try:
                model = adapter.validate_python(raw[i])
            except ValidationError as exc:
                raise MessageError(i, exc) from exc
            models.append(model)
            if derive is not None:
                derived.append(derive(model))
        conversation = _Conversation(kind, raw, models, derived if derive is not None else [])
        with self._lock:
            self.validated += len(raw) - reused
            kept = [c for c in self._recent if c is not best]
            self._recent = [conversation, *kept][:MAX_CONVERSATIONS]
        return list(models), list(derived)


def common_prefix(a: list[Any], b: list[Any]) -> int:
    """How many leading items of `a` and `b` are equal."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
