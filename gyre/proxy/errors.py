"""Errors a harness can act on, in the shape of the API it speaks.

A harness's SDK decides whether to retry, give up or shrink its context from the status
and error type, so the proxy answers an OpenAI client in OpenAI's shape and an Anthropic
client in Anthropic's, for the same underlying problem (`ProxyError.kind` is one of the
neutral kinds below, mapped per API).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError
from starlette.responses import Response

# neutral kind -> (OpenAI error type, Anthropic error type)
_KINDS = {
    "invalid_request": ("invalid_request_error", "invalid_request_error"),
    "context_length": ("invalid_request_error", "invalid_request_error"),
    "authentication": ("authentication_error", "authentication_error"),
    "not_found": ("not_found_error", "not_found_error"),
    "timeout": ("invalid_request_error", "timeout_error"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "overloaded": ("server_error", "overloaded_error"),
    "engine_failed": ("server_error", "api_error"),
    "internal": ("server_error", "api_error"),
}
_ANTHROPIC_STATUS = {"overloaded": 529}
"""Anthropic signals 'no capacity, retry' with 529; OpenAI clients know 503."""


class ProxyError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request", param: str | None = None) -> None:
        super().__init__(message)
        if kind not in _KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        self.status, self.message, self.kind, self.param = status, message, kind, param


def openai_error_body(exc: ProxyError) -> dict[str, Any]:
    code = "context_length_exceeded" if exc.kind == "context_length" else None
    return {"error": {"message": exc.message, "type": _KINDS[exc.kind][0], "param": exc.param, "code": code}}


def anthropic_error_body(exc: ProxyError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _KINDS[exc.kind][1], "message": exc.message}}


def error_response(exc: ProxyError, api: str) -> Response:
    if api == "anthropic":
        status = _ANTHROPIC_STATUS.get(exc.kind, exc.status)
        body = anthropic_error_body(exc)
    else:
        status, body = exc.status, openai_error_body(exc)
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


_MISMATCH = ("literal_error", "union_tag_invalid", "model_type", "model_attributes_type")


def validation_problem(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> str:
    """`where: what` for one of pydantic's errors: for a union, the branch that fits best (not
    a type mismatch, else the one that got deepest), so a stop list of 100 strings reads 'at
    most 32 items', not 'should be a valid string', and a tool_use block whose input is a list
    names `input`. Branch names pydantic puts in the path (`list[ContentPart]`,
    `constrained-str`) are left out: they are not fields."""
    errors = exc.errors(include_url=False)
    if not errors:
        return ""

    def fit(e: dict[str, Any]) -> tuple[bool, int]:
        return not (e["type"].endswith("_type") or e["type"] in _MISMATCH), len(e.get("loc", ()))

    best = max(errors, key=fit)  # max keeps the first of equals
    loc = (*prefix, *best.get("loc", ()))
    where = ".".join(str(p) for p in loc if not (isinstance(p, str) and ("[" in p or "-" in p)))
    return f"{where or 'body'}: {best.get('msg', 'bad input')}"
