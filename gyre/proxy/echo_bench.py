"""The proxy's overhead on agent-shaped sessions as a real harness drives it: echoing the model.

`session_bench` replays scripted assistant turns, which never match what the engine sampled,
so the proxy re-renders the conversation on every call (its TITO fallback): an upper bound on
its overhead. A real harness sends back the assistant message the proxy returned, so the
proxy extends the token ids it already has and templates and tokenises only the new turns.
This replays agent-shaped sessions that way: call k+1 is call k's conversation, plus the
assistant message as the proxy returned it, plus the session's scripted tool results (`tool`
messages answering the returned tool calls, or one user message when the model called none),
so contexts grow by thousands of tokens a call to `target_tokens`.

The proxy runs the real app in a child process in front of the `NullEngine` (it answers at
once, as in `gyre.proxy.bench`), so a call's round trip is the proxy's overhead: HTTP, the
body's JSON, templating and tokenising the new turns, recording, the answer. `concurrency`
sessions run at once (32: the issue's setting); p50 and p99 over every call.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import httpx

from gyre.proxy.agent_sessions import AgentSession, agent_sessions

DEFAULT_CONCURRENCY = 32
DEFAULT_TARGET_TOKENS = 50_000
RESULT_CHARS = (8_000, 16_000)  # per tool result: a step adds ~3-9k tokens, so ~10 calls reach 50k
TOKENS_PER_CHAR = 0.3  # the tiny tokenizer on the sessions' code and logs, about (for the turn count)


def next_messages(messages: list[dict], answer: dict, step) -> list[dict]:
    """The conversation after an answer: the assistant message as returned, then the step's results."""
    message = answer["choices"][0]["message"]
    assistant = {"role": "assistant", "content": message.get("content") or ""}
    calls = message.get("tool_calls") or []
    if calls:
        assistant["tool_calls"] = calls
    out = [*messages, assistant]
    results = list(step.results)
    if calls:
        out += [{"role": "tool", "tool_call_id": call["id"], "content": results[i % len(results)]}
                for i, call in enumerate(calls)]
    else:
        out.append({"role": "user", "content": "\n\n".join(results)})
    return out


async def replay(client: httpx.AsyncClient, key: str, session: AgentSession, max_tokens: int = 16) -> list[tuple[int, float]]:
    """The session's calls in order, echoing each answer; (request body bytes, seconds) per call."""
    messages = session.openai_messages(1)
    out = []
    for k in range(1, session.turns + 1):
        body = {"model": "null", "messages": messages, "tools": session.tools, "max_tokens": max_tokens}
        started = time.perf_counter()
        response = await client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
        seconds = time.perf_counter() - started
        if response.status_code != 200:
            raise RuntimeError(f"{session.session_id} call {k}: proxy answered {response.status_code}: "
                               f"{response.text[:300]}")
        out.append((len(response.request.content), seconds))
        if k < session.turns:
            messages = next_messages(messages, response.json(), session.steps[k - 1])
    return out


def run(concurrency: int = DEFAULT_CONCURRENCY, target_tokens: int = DEFAULT_TARGET_TOKENS, seed: int = 0,
        result_chars: tuple[int, int] = RESULT_CHARS) -> dict:
    """`concurrency` echoing sessions growing to about `target_tokens`, all at once, through the
    null proxy; the per-call overhead's p50 / p99 (milliseconds)."""
    from gyre.proxy.bench import NUM_EXECUTIONS, null_proxy

    if concurrency > NUM_EXECUTIONS:
        raise ValueError(f"at most {NUM_EXECUTIONS} sessions (the benchmark server's keys)")
    longest = agent_sessions(1, 200, seed, api="openai", result_chars=result_chars)[0]
    chars, turns = 0, 1
    while chars * TOKENS_PER_CHAR < target_tokens and turns < 200:  # calls until the context reaches the target
        chars += sum(len(r) for r in longest.steps[turns - 1].results)
        turns += 1
    plan = agent_sessions(concurrency, turns, seed, api="openai", result_chars=result_chars)
    with null_proxy() as (port, keys):
        load_before = os.getloadavg()[0]

        async def all_sessions() -> list[list[tuple[int, float]]]:
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600, limits=limits) as client:
                return await asyncio.gather(*(replay(client, keys[i], s) for i, s in enumerate(plan)))

        started = time.perf_counter()
        per_session = asyncio.run(all_sessions())
        wall_s = time.perf_counter() - started
    ms = [s * 1e3 for calls in per_session for _, s in calls]
    last = [calls[-1] for calls in per_session]
    return {
        "p50_overhead_ms": round(statistics.median(ms), 3),
        "p99_overhead_ms": round(statistics.quantiles(ms, n=100, method="inclusive")[98], 3),
        "calls": len(ms), "sessions": concurrency, "turns": turns, "wall_s": round(wall_s, 2),
        "last_call_body_kb": round(statistics.median(b for b, _ in last) / 1024, 1),
        "last_call_ms_p50": round(statistics.median(s * 1e3 for _, s in last), 3),
        "targets": {"p50_overhead_ms": 2.0, "p99_overhead_ms": 20.0},
        "load_avg_1m_before": round(load_before, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }
