"""The builtin agent's one way to the model: OpenAI chat completions on the proxy.

Every call the builtin agent makes (a turn of the main agent, of a sub-agent, or a
compaction request) goes through `ModelClient.chat`, so all of them reach the proxy with
this execution's key and are recorded under the execution like any other call. The
`x-gyre-agent-id` header names which agent is talking (`main`, `sub-1`, ...): the proxy
records it on the call, and the trajectory classifier prefers it to guessing from the
prompts (`gyre.trajectories.classify`, rule 1).

Transport errors and 5xx answers are retried a bounded number of times with backoff (a
proxy draining a cell answers 503 for a moment); a call that runs past the harness
deadline returns None, which the agent reports as `harness_timeout`.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from gyre.harnesses.base import ModelEndpoint

AGENT_HEADER = "x-gyre-agent-id"
HTTP_RETRIES = 3
HTTP_BACKOFF_S = 0.5


class ModelClient:
    def __init__(self, endpoint: ModelEndpoint, max_tokens: int | None = None) -> None:
        self.model = endpoint.model
        self.max_tokens = max_tokens
        self._client = httpx.Client(base_url=endpoint.base_url,
                                    headers={"Authorization": f"Bearer {endpoint.api_key}"})

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self._client.close()

    def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], agent_id: str, deadline_s: float,
        max_tokens: int | None = None,
    ) -> dict[str, Any] | None:
        """One chat completion (the response JSON); None when the deadline passes first.
        `max_tokens`: this call's cap, instead of the client's."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "tools": tools}
        if max_tokens or self.max_tokens:
            body["max_tokens"] = max_tokens or self.max_tokens
        headers = {AGENT_HEADER: agent_id}
        for attempt in range(HTTP_RETRIES):
            remaining = deadline_s - time.monotonic()
            if remaining <= 0:
                return None
            try:
                response = self._client.post("/chat/completions", json=body, headers=headers, timeout=remaining)
            except httpx.TimeoutException:
                return None
            except httpx.TransportError:
                if attempt == HTTP_RETRIES - 1:
                    raise
                time.sleep(HTTP_BACKOFF_S * 2**attempt)
                continue
            if response.status_code >= 500 and attempt < HTTP_RETRIES - 1:
                time.sleep(HTTP_BACKOFF_S * 2**attempt)
                continue
            response.raise_for_status()
            return response.json()
        raise RuntimeError("unreachable")


def context_tokens(response: dict[str, Any]) -> int:
    """Tokens the agent's context held after this call (prompt + output, as the proxy counted)."""
    usage = response.get("usage") or {}
    return int(usage.get("total_tokens") or usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))
