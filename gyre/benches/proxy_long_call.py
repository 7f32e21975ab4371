"""The prefix cache on a long agent session: one call that extends a ~50k-token session.

An agent's later calls resend the whole conversation (Claude Code's reach 50k tokens and
more); without a prefix cache every call prefills all of it again. This measures the call
the learning issue names, through the real proxy over HTTP, in one run: a session of about
`session_tokens` prompt tokens (an agent-shaped conversation, `agent_sessions`, with long tool
results; counted on the rendered chat template), then the call that extends it by about
`extend_tokens` (the assistant's next tool call and its result) and samples `samples` tokens:

- with the cache: the session's call first (it fills the cache), then the extending call, timed;
- without it (`prefix_cache_bytes: 0`): the extending call, timed (it prefills everything).

The extending call runs `repeats` times on each engine, alternating (with, without, with, ...),
the cached one each time from a copy of the cache as the session's call left it, so a change in
the box's load hits both alike. The figure is the ratio of the two median wall times (every time
is reported); the target is <= 0.10. Both engines are the torch reference engine on the bundled
tiny model (or `model_dir`), greedy, one call at a time. The real token counts come from the
proxy's `usage`: the session's prompt, the extended one and their difference (what the cached
call prefills). The process's CPU seconds per call are reported too (`cpu_cached_over_uncached`):
on a loaded box a short call's wall time depends on what else runs, its CPU time much less.

Where the floor is: the extending call's new tokens attend to the whole session, the uncached
call's tokens each to everything before them, so attention alone (nearly all a long prompt costs
on the tiny model) puts the ratio near `ext * (session + ext / 2) / (total ** 2 / 2)`: 0.076 for
2,035 tokens on 50,265. The rest is work both calls do alike: 15 decode steps, each reading the
whole KV; the proxy rendering and tokenising the whole scripted conversation again (its slow path,
see `proxy_sessions.py`); per-forward Python. Measured on a 2-core box (2026-12-01, `run()`
defaults: 50,265 + 2,035 tokens, 16 sampled, 2 repeats): cached 0.71-0.76 s, uncached 7.3-7.7 s,
ratio 0.093-0.098 (CPU 0.088-0.089) at load 1-2; 0.087-0.091 at load 3-4. Of the cached call's
~0.7 s, the prefix attention is ~80 %, decoding ~9 %, the proxy ~7 %.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from gyre.benches.agent_sessions import agent_sessions

DEFAULT_SESSION_TOKENS = 50_000
DEFAULT_EXTEND_TOKENS = 2_000
DEFAULT_SAMPLES = 16
DEFAULT_REPEATS = 2
CHARS_PER_TOKEN = 1.5  # the tiny model's byte-level BPE on the sessions' numbered code and logs, about
EXTEND_TOLERANCE = 0.1  # an extending step within 10 % of `extend_tokens` is taken at once
TIMEOUT_S = 1800.0  # one uncached 52k-token prefill takes ~7 s on a quiet 2-core box, minutes on a loaded one


def _bodies(tokenizer, session_tokens: int, extend_tokens: int, samples: int, seed: int) -> tuple[dict, dict, int]:
    """(the session's call, the extending call, its call number) in OpenAI shape: the first call
    whose prompt is at or past `session_tokens` and whose next step adds within `EXTEND_TOLERANCE`
    of `extend_tokens` (else, of the next nine, the one closest to it), counted on the rendered
    chat template. A step's tool result is sized to about `extend_tokens` (edit steps add less)."""
    per_result = int(extend_tokens * CHARS_PER_TOKEN)
    turns = max(4, 3 * session_tokens // extend_tokens)
    session = agent_sessions(1, turns, seed, api="openai", result_chars=(per_result * 4 // 5, per_result * 6 // 5))[0]
    sizes = []  # prompt tokens of call k, k = 1..turns
    for k in range(1, turns + 1):
        body = session.openai_body(k, samples)
        text = tokenizer.apply_chat_template(body["messages"], tools=body["tools"], tokenize=False,
                                             add_generation_prompt=True)
        sizes.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
        if sizes[-1] >= session_tokens + 10 * extend_tokens:
            break
    first = next((k for k in range(1, len(sizes)) if sizes[k - 1] >= session_tokens), None)
    if first is None:
        raise ValueError(f"a session of {turns} calls stays under {session_tokens} tokens")
    candidates = range(first, min(first + 8, len(sizes) - 1) + 1)
    off = {k: abs(sizes[k] - sizes[k - 1] - extend_tokens) for k in candidates}
    k = next((k for k in candidates if off[k] <= EXTEND_TOLERANCE * extend_tokens), min(candidates, key=off.get))
    return session.openai_body(k, samples), session.openai_body(k + 1, samples), k + 1


def run(session_tokens: int = DEFAULT_SESSION_TOKENS, extend_tokens: int = DEFAULT_EXTEND_TOKENS,
        samples: int = DEFAULT_SAMPLES, seed: int = 0, model_dir: Path | None = None,
        repeats: int = DEFAULT_REPEATS) -> dict:
    """The extending call's time with and without the prefix cache, same run; figures as a dict."""
    from gyre.benches.proxy_sessions import _stack
    from gyre.engines.models.hf import load_tokenizer
    from gyre.engines.models.tiny import cached_tiny_model

    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if model_dir is None:
        model_dir = cached_tiny_model(Path(tempfile.gettempdir()) / "gyre-bench-models")
    tokenizer = load_tokenizer(model_dir)
    first, extended, turns = _bodies(tokenizer, session_tokens, extend_tokens, samples, seed)
    cached = _stack("long-cache", model_dir, tokenizer, 2**31, 1)
    uncached = _stack("long-nocache", model_dir, tokenizer, 0, 1)
    try:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            key_c, key_u = cached.registry.mint("long-c"), uncached.registry.mint("long-u")
            warm = _call(client, cached, key_c, first)
            filled = copy.deepcopy(cached.engine.prefix_cache)  # the cache as the session's call left it
            with_cache, without = [], []
            for _ in range(repeats):
                cached.engine.prefix_cache = copy.deepcopy(filled)  # the engine is idle between calls
                with_cache.append(_call(client, cached, key_c, extended))
                without.append(_call(client, uncached, key_u, extended))
            hits = cached.engine.prefix_cache.hit_tokens - filled.hit_tokens
    finally:
        cached.close()
        uncached.close()
    median = {name: {field: round(statistics.median(c[field] for c in calls), 3) for field in ("seconds", "cpu_s")}
              for name, calls in (("cached", with_cache), ("uncached", without))}
    return {
        "session_prompt_tokens": warm["prompt_tokens"], "extended_prompt_tokens": without[0]["prompt_tokens"],
        "extension_tokens": without[0]["prompt_tokens"] - warm["prompt_tokens"],
        "turns": turns, "samples": samples, "repeats": repeats, "session_call_s": warm["seconds"],
        "extending_call_cached_s": median["cached"]["seconds"],
        "extending_call_uncached_s": median["uncached"]["seconds"],
        "cached_over_uncached": round(median["cached"]["seconds"] / median["uncached"]["seconds"], 4),
        "target": "<= 0.10",
        "each_s": {"cached": [c["seconds"] for c in with_cache], "uncached": [c["seconds"] for c in without]},
        "in_engine_s": {"cached": [c["engine_s"] for c in with_cache], "uncached": [c["engine_s"] for c in without]},
        "extending_call_cpu_s": {"cached": median["cached"]["cpu_s"], "uncached": median["uncached"]["cpu_s"]},
        "cpu_cached_over_uncached": round(median["cached"]["cpu_s"] / median["uncached"]["cpu_s"], 4),
        "cache_hit_tokens": hits,
        "same_output": all(c["output"] == u["output"] for c in with_cache for u in without),
    }


def _call(client: httpx.Client, stack, key: str, body: dict) -> dict:
    url = f"http://{stack.server.host}:{stack.server.port}/v1/chat/completions"
    started, cpu = time.perf_counter(), time.process_time()
    response = client.post(url, json=body, headers={"authorization": f"Bearer {key}"})
    seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    response.raise_for_status()
    answer = response.json()
    # the engine's time for this prompt (the longest prompt the stack has seen is this call's)
    engine_s = max(stack.timed.seconds.items(), key=lambda item: len(item[0]))[1]
    return {"seconds": round(seconds, 3), "cpu_s": round(cpu_s, 3), "engine_s": round(engine_s, 3),
            "prompt_tokens": answer["usage"]["prompt_tokens"], "output": answer["choices"][0]["message"]}
