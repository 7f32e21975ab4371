"""The prefix cache on a long agent session: one call that extends a ~50k-token session.

An agent's later calls resend the whole conversation (Claude Code's reach 50k tokens and
more); without a prefix cache every call prefills all of it again. This measures the call
the learning issue names, through the real proxy over HTTP, in one run: a session of about
`session_tokens` tokens (an agent-shaped conversation, `agent_sessions`, with long tool
results), then the call that extends it by about `extend_tokens` (the assistant's next tool
call and its result) and samples `samples` tokens:

- with the cache: the session's call first (it fills the cache), then the extending call, timed;
- without it (`prefix_cache_bytes: 0`): the extending call alone, timed (it prefills everything).

The figure is the ratio of the two times; the target is <= 0.10. Both engines are the torch
reference engine on the bundled tiny model (or `model_dir`), greedy, one call at a time.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import httpx

from gyre.proxy.agent_sessions import agent_sessions

DEFAULT_SESSION_TOKENS = 50_000
DEFAULT_EXTEND_TOKENS = 2_000
DEFAULT_SAMPLES = 16
CHARS_PER_TOKEN = 3.5  # the tiny model's byte-level BPE on the sessions' code and logs, about
TIMEOUT_S = 1800.0  # one uncached 50k-token prefill takes 9 s on an idle 2-core box, minutes on a loaded one


def _bodies(tokenizer, session_tokens: int, extend_tokens: int, samples: int, seed: int) -> tuple[dict, dict, int]:
    """(the session's call, the extending call, its call number) in OpenAI shape: the first call
    at or past `session_tokens` whose next step adds the closest to `extend_tokens` (of the next
    nine), counted on the messages' text (the template adds a little)."""
    per_result = int(extend_tokens * CHARS_PER_TOKEN / 1.5)  # a step holds one or two tool results
    turns = max(4, 3 * session_tokens // extend_tokens)
    session = agent_sessions(1, turns, seed, api="openai", result_chars=(per_result * 4 // 5, per_result * 6 // 5))[0]
    sizes = []  # text tokens of call k's prompt, k = 1..turns
    for k in range(1, turns + 1):
        text = "".join(m.get("content") or "" for m in session.openai_messages(k))
        sizes.append(len(tokenizer(text)["input_ids"]))
        if sizes[-1] >= session_tokens + 10 * extend_tokens:
            break
    first = next((k for k in range(1, len(sizes)) if sizes[k - 1] >= session_tokens), None)
    if first is None:
        raise ValueError(f"a session of {turns} calls stays under {session_tokens} tokens")
    last = min(first + 8, len(sizes) - 1)
    k = min(range(first, last + 1), key=lambda k: abs(sizes[k] - sizes[k - 1] - extend_tokens))
    return session.openai_body(k, samples), session.openai_body(k + 1, samples), k + 1


def run(session_tokens: int = DEFAULT_SESSION_TOKENS, extend_tokens: int = DEFAULT_EXTEND_TOKENS,
        samples: int = DEFAULT_SAMPLES, seed: int = 0, model_dir: Path | None = None) -> dict:
    """The extending call's time with and without the prefix cache, same run; figures as a dict."""
    from gyre.engines.hf import load_tokenizer
    from gyre.engines.tiny_model import cached_tiny_model
    from gyre.proxy.session_bench import _stack

    if model_dir is None:
        model_dir = cached_tiny_model(Path(tempfile.gettempdir()) / "gyre-bench-models")
    tokenizer = load_tokenizer(model_dir)
    first, extended, turns = _bodies(tokenizer, session_tokens, extend_tokens, samples, seed)
    cached = _stack("long-cache", model_dir, tokenizer, 2**31, 1)
    uncached = _stack("long-nocache", model_dir, tokenizer, 0, 1)
    try:
        key_c, key_u = cached.registry.mint("long-c"), uncached.registry.mint("long-u")
        warm = _call(cached, key_c, first)
        with_cache = _call(cached, key_c, extended)
        without = _call(uncached, key_u, extended)
        hits = cached.engine.prefix_cache.hit_tokens
    finally:
        cached.close()
        uncached.close()
    return {
        "session_prompt_tokens": warm["prompt_tokens"], "extended_prompt_tokens": with_cache["prompt_tokens"],
        "turns": turns, "samples": samples,
        "session_call_s": warm["seconds"], "extending_call_cached_s": with_cache["seconds"],
        "extending_call_uncached_s": without["seconds"],
        "cached_over_uncached": round(with_cache["seconds"] / without["seconds"], 4),
        "target": "<= 0.10", "cache_hit_tokens": hits,
        "same_output": with_cache["output"] == without["output"],
    }


def _call(stack, key: str, body: dict) -> dict:
    url = f"http://{stack.server.host}:{stack.server.port}/v1/chat/completions"
    started = time.perf_counter()
    response = httpx.post(url, json=body, headers={"authorization": f"Bearer {key}"}, timeout=TIMEOUT_S)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    answer = response.json()
    return {"seconds": round(seconds, 3), "prompt_tokens": answer["usage"]["prompt_tokens"],
            "output": answer["choices"][0]["message"]}
