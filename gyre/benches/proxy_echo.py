"""The proxy's overhead on agent-shaped sessions as a real harness drives it: echoing the model.

`proxy_sessions` replays scripted assistant turns, which never match what the engine sampled,
so the proxy re-renders the conversation on every call (its TITO fallback): an upper bound on
its overhead. A real harness sends back the assistant message the proxy returned, so the
proxy extends the token ids it already has and templates and tokenises only the new turns.
This replays agent-shaped sessions that way: call k+1 is call k's conversation, plus the
assistant message as the proxy returned it, plus the session's scripted tool results (`tool`
messages answering the returned tool calls, or one user message when the model called none),
so contexts grow by thousands of tokens a call to `target_tokens`.

The proxy runs the real app in a child process in front of the `NullEngine` (it answers at
once, as in `gyre.benches.proxy`), so a call's round trip is the proxy's overhead: HTTP, the
body's JSON, templating and tokenising the new turns, recording, the answer. The client is a
bare keep-alive HTTP/1.1 connection per session (`RawClient`: the request is encoded before its
clock starts; a client library's own request building would be measured too). `concurrency`
sessions run at once (32: the issue's setting); p50 and p99 over every call, and the proxy
process's CPU over that phase in cores (`concurrent_proxy_cpu_cores`: near the box's core count, less what the
client itself takes on the same box, `concurrent_client_cpu_cores`, when the proxy is bound by the cores rather
than by one thread holding the GIL), and its three busiest threads' (`concurrent_busiest_thread_cores`: the
event loop's thread near 1.0 says that one thread is what bounds the proxy). /proc counts CPU time in clock ticks,
so each of those figures is within `concurrent_cpu_resolution_cores` (one tick over the phase's wall time) of the truth:
on a short phase (a test's two sessions: ~0.04 s) a tick is a quarter of a core.

In the same run, to say where the time goes: one session at a time (`sequential_*`: a call's
service time with nothing queued before it), and `tokenize_new_*`: tokenising each of those
calls' new text alone (the messages appended since the previous call; the whole first prompt
but the tools, which the proxy caches per process) with the same tokenizer, one thread, in the
client right after the call was answered (the same moment's load), each way on a tokenizer of its own so that
each meets the text for the first time, as the proxy does: the part of a call's work that any server taking
text must do.
`sequential_over_tokenize_p50_ms` is the median over those calls of the one minus the other;
the `_fast` figures take the fastest way to tokenise a text alone (`encode_batch_fast`, no
character offsets; the proxy tokenises that way since 2026-12-05) as the baseline instead of
`encode`: the fair one, since the proxy's own tokenising is no longer `encode`. The two ways take
turns going first, and each is read from the calls where it went first (`_Tokenize` says why;
`tokenize_new_fast_warm_p50_ms` is `encode_batch_fast` timed second, the baseline before 2026-12-08).
At 32 at once, a call's round trip is mostly its wait behind the other sessions' calls (a
closed loop with no think time: each session sends its next call as soon as the last is
answered).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable

import orjson

from gyre.benches.agent_sessions import AgentSession, agent_sessions
from gyre.proxy.gc_tuning import GC_THRESHOLD0

DEFAULT_CONCURRENCY = 32
DEFAULT_TARGET_TOKENS = 50_000
RESULT_CHARS = (8_000, 16_000)  # per tool result: a step adds ~3-9k tokens, so ~10 calls reach 50k
SEQUENTIAL_SESSIONS = 8  # replayed one call at a time after the concurrent ones (other seeds; 136 calls)
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


def message_text(message: dict) -> str:
    """The text of a message the template renders (content, tool-call names and arguments)."""
    calls = "".join(c["function"]["name"] + str(c["function"]["arguments"]) for c in message.get("tool_calls") or [])
    return (message.get("content") or "") + calls


class RawClient:
    """One keep-alive HTTP/1.1 connection with as little client work as possible (`gyre.benches.proxy`
    does the same): what is timed is the proxy, not a client library's request building."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> "RawClient":
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc) -> None:
        self.writer.close()

    @staticmethod
    def request(key: str, body: bytes) -> bytes:
        return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    async def post(self, raw: bytes) -> tuple[int, bytes]:
        """Send a prepared request; (status, body) of the answer."""
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return status, await self.reader.readexactly(length)


async def replay(client: RawClient, key: str, session: AgentSession, max_tokens: int = 16,
                 after_call: Callable[[str], None] | None = None) -> list[tuple[int, float]]:
    """The session's calls in order, echoing each answer; (request body bytes, seconds) per call.
    `after_call(new text)` runs after each call is answered, before the next one is sent."""
    messages = session.openai_messages(1)
    out, sent = [], 0
    for k in range(1, session.turns + 1):
        new_text = "".join(message_text(m) for m in messages[sent:])
        sent = len(messages)
        body = orjson.dumps({"model": "null", "messages": messages, "tools": session.tools, "max_tokens": max_tokens})
        raw = client.request(key, body)  # the client's own work, before the clock starts
        started = time.perf_counter()
        status, answer = await client.post(raw)
        seconds = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"{session.session_id} call {k}: proxy answered {status}: {answer[:300]!r}")
        out.append((len(body), seconds))
        if after_call is not None:
            after_call(new_text)
        if k < session.turns:
            messages = next_messages(messages, orjson.loads(answer), session.steps[k - 1])
    return out


async def all_at_once(port: int, keys: list[str], plan: list[AgentSession],
                      first_key: int = 0) -> list[list[tuple[int, float]]]:
    """Every session of `plan` replayed at once, the i-th with key `keys[first_key + i]`, each on its own
    connection; `replay`'s (body bytes, seconds) per call, per session."""
    async def one(i: int, session: AgentSession) -> list[tuple[int, float]]:
        async with RawClient(port) as client:
            return await replay(client, keys[first_key + i], session)

    return await asyncio.gather(*(one(i, s) for i, s in enumerate(plan)))


def run(concurrency: int = DEFAULT_CONCURRENCY, target_tokens: int = DEFAULT_TARGET_TOKENS, seed: int = 0,
        result_chars: tuple[int, int] = RESULT_CHARS, build_processes: int = 0,
        gc_threshold: int | None = GC_THRESHOLD0) -> dict:
    """`concurrency` echoing sessions growing to about `target_tokens`, all at once, through the
    null proxy (building prompts in `build_processes` worker processes, or in its own with 0; its collector's young
    threshold `gc_threshold`, None for Python's own settings); the per-call overhead's p50 / p99 (milliseconds)."""
    from gyre.benches.proxy import (
        CLOCK_TICK_S, NUM_EXECUTIONS, _quantile, cpu_seconds, null_proxy_process, thread_cpu_seconds,
    )

    if concurrency + SEQUENTIAL_SESSIONS > NUM_EXECUTIONS:
        raise ValueError(f"at most {NUM_EXECUTIONS - SEQUENTIAL_SESSIONS} sessions (the benchmark server's keys)")
    longest = agent_sessions(1, 200, seed, api="openai", result_chars=result_chars)[0]
    chars, turns = 0, 1
    while chars * TOKENS_PER_CHAR < target_tokens and turns < 200:  # calls until the context reaches the target
        chars += sum(len(r) for r in longest.steps[turns - 1].results)
        turns += 1
    plan = agent_sessions(concurrency, turns, seed, api="openai", result_chars=result_chars)
    sequential_plan = agent_sessions(SEQUENTIAL_SESSIONS, turns, seed + 1, api="openai", result_chars=result_chars)
    tokenize = _Tokenize()
    with null_proxy_process(build_processes, gc_threshold) as (port, keys, pid):
        load_before = os.getloadavg()[0]

        async def one_at_a_time() -> list[tuple[int, float]]:
            out = []
            for i, s in enumerate(sequential_plan):
                async with RawClient(port) as client:
                    out += await replay(client, keys[concurrency + i], s, after_call=tokenize)
            return out

        cpu_before, client_before = cpu_seconds(pid), time.process_time()
        threads_before = thread_cpu_seconds(pid)
        started = time.perf_counter()
        per_session = asyncio.run(all_at_once(port, keys, plan))
        wall_s = time.perf_counter() - started
        proxy_cores = (cpu_seconds(pid) - cpu_before) / wall_s
        thread_cores = sorted(((s - threads_before.get(tid, 0.0)) / wall_s
                               for tid, s in thread_cpu_seconds(pid).items()), reverse=True)
        client_cores = (time.process_time() - client_before) / wall_s
        sequential_ms = [s * 1e3 for _, s in asyncio.run(one_at_a_time())]
    ms = [s * 1e3 for calls in per_session for _, s in calls]
    last = [calls[-1] for calls in per_session]
    # each sequential call's own new text, timed after it; each way from the calls where it went first
    tokenize_ms = tokenize.when_first("plain", tokenize.plain_ms)
    fast_ms = tokenize.when_first("fast", tokenize.fast_ms)
    over_ms = tokenize.when_first("plain", [a - b for a, b in zip(sequential_ms, tokenize.plain_ms)])
    over_fast_ms = tokenize.when_first("fast", [a - b for a, b in zip(sequential_ms, tokenize.fast_ms)])
    return {
        "p50_overhead_ms": round(statistics.median(ms), 3),
        "p99_overhead_ms": round(_quantile(ms, 0.99), 3),
        "sequential_p50_ms": round(statistics.median(sequential_ms), 3),
        "sequential_p99_ms": round(_quantile(sequential_ms, 0.99), 3),
        "tokenize_new_p50_ms": round(statistics.median(tokenize_ms), 3),
        "tokenize_new_p99_ms": round(_quantile(tokenize_ms, 0.99), 3),
        "sequential_over_tokenize_p50_ms": round(statistics.median(over_ms), 3),
        "tokenize_new_fast_p50_ms": round(statistics.median(fast_ms), 3),
        "tokenize_new_fast_p99_ms": round(_quantile(fast_ms, 0.99), 3),
        "sequential_over_tokenize_fast_p50_ms": round(statistics.median(over_fast_ms), 3),
        "tokenize_new_fast_warm_p50_ms": round(statistics.median(tokenize.fast_warm_ms), 3),
        "concurrent_proxy_cpu_cores": round(proxy_cores, 2),
        "concurrent_client_cpu_cores": round(client_cores, 2),
        "concurrent_busiest_thread_cores": [round(c, 2) for c in thread_cores[:3]],
        "concurrent_cpu_resolution_cores": round(CLOCK_TICK_S / wall_s, 3),
        "cpu_count": os.cpu_count(),
        "build_processes": build_processes, "gc_threshold": gc_threshold, "calls_per_s": round(len(ms) / wall_s, 1),
        "calls": len(ms), "sessions": concurrency, "turns": turns, "wall_s": round(wall_s, 2),
        "last_call_body_kb": round(statistics.median(b for b, _ in last) / 1024, 1),
        "last_call_ms_p50": round(statistics.median(s * 1e3 for _, s in last), 3),
        "targets": {"p50_overhead_ms": 2.0, "p99_overhead_ms": 20.0},
        "load_avg_1m_before": round(load_before, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }


class _Tokenize:
    """Times tokenising one call's new text alone with the benchmark server's tokenizer, one thread, two ways:
    `encode` (the figures before 2026-12-05 evening) and `encode_batch_fast` of the one text (no character
    offsets: the fastest call, the one the proxy makes, `escape.py`). Called right after each sequential call
    (`replay`'s `after_call`), so a call and its baseline are timed under the same moment's load (before
    2026-12-07 the baselines were timed after all the calls, and the box's load drifted between the two).

    Each way has its own tokenizer, so each tokenises each text for the first time, as the proxy does: a
    BPE tokenizer caches the words it has merged, and the same text a second time took 0.5-0.8 ms less here
    (`encode_batch_fast` right after `encode` of the same text, as this timed it before 2026-12-07 evening:
    that baseline was warm, the proxy's tokenising never is).

    The two ways take turns going first (`first`), and each way's baseline is read from the calls where it
    went first: whichever tokenises second in a row runs with the tokenizer library's code and tables warm
    in the core's caches (here 0.15-0.25 ms faster in this client, 0.3-0.5 ms in the proxy's process:
    docs/benches.md), and the proxy's own tokenising always comes after other work (JSON, rendering).
    Until 2026-12-08 `encode_batch_fast` always went second (`fast_warm_ms` keeps that figure)."""

    def __init__(self) -> None:
        from tokenizers import Tokenizer

        from gyre.benches.proxy import _tokenizer

        definition = _tokenizer().backend_tokenizer.to_str()
        self._plain, self._fast = Tokenizer.from_str(definition), Tokenizer.from_str(definition)
        self.plain_ms: list[float] = []
        self.fast_ms: list[float] = []
        self.first: list[str] = []  # per call: "plain" or "fast", the way timed first

    def __call__(self, text: str) -> None:
        ways = [("plain", self._plain_once), ("fast", self._fast_once)]
        if len(self.first) % 2:
            ways.reverse()
        self.first.append(ways[0][0])
        for _, way in ways:
            way(text)

    def _plain_once(self, text: str) -> None:
        started = time.perf_counter()
        self._plain.encode(text, add_special_tokens=False)
        self.plain_ms.append((time.perf_counter() - started) * 1e3)

    def _fast_once(self, text: str) -> None:
        started = time.perf_counter()
        self._fast.encode_batch_fast([text], add_special_tokens=False)
        self.fast_ms.append((time.perf_counter() - started) * 1e3)

    def when_first(self, way: str, values: list[float]) -> list[float]:
        """`values` (one per call) of the calls where `way` was timed first."""
        return [v for v, first in zip(values, self.first) if first == way]

    @property
    def fast_warm_ms(self) -> list[float]:
        """`encode_batch_fast` timed right after `encode` of the same text (the baseline before 2026-12-08)."""
        return self.when_first("plain", self.fast_ms)
