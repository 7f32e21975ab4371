"""The proxy benchmark on agent-shaped sessions: proxy overhead and the prefix cache, per call.

`gyre bench proxy-sessions --sessions N` replays N agent sessions (`agent_sessions.py`: system prompt,
tools, tool calls and tool results, each call's prompt the previous one plus hundreds to
thousands of tokens), each a chain of K calls, through the real proxy (uvicorn in a thread,
`create_app`, TITO prompt building, recording) over HTTP with httpx, in front of a real
`TorchRolloutEngine` on the bundled tiny model; each session speaks its own API (OpenAI or
Anthropic, alternating). In one run:

- the prefix cache's effect: the sessions, at most C at a time, once on an engine with the
  cache (`rollout.prefix_cache_bytes`' default) and once on one without it (0), each replay
  starting cold. Per call k = 1..K: the median time of the k-th call with and without the
  cache, through the proxy and inside `engine.generate`, and the cache's hit tokens (each
  lookup's, from `CountingPrefixCache`, and the engine's own `hit_tokens` / `miss_tokens`).
- the proxy's overhead against the same engine called directly with the same prompts: the
  first `paired_sessions` sessions one call at a time, each call through the proxy and its
  prompt ids (as the proxy built and recorded them) straight into `engine.generate`, on the
  engine without a cache so both do the same work, twice (proxy, direct, direct, proxy; best
  of each); p50 / p95 of the per-call difference. Concurrent calls cannot be paired so: with
  dynamic batching a call's time depends on which calls share its batch, which differs between
  any two replays; there the overhead is taken inside each call instead ("in call"): its round
  trip minus the time that same call spent in `engine.generate`.

Sampling is greedy with a small `max_tokens`: the engine's output only has to exist.

What a scripted history does to the proxy. The assistant turns are the session's, not what
the engine generated, so they never match the output the proxy remembered (`prompt.py`):
no prefix state prefixes the next request's rendering, every earlier assistant turn is a
fallback (template tokens, counted in `fallback_turns`: k - 1 on call k), and each call
renders the conversation up to every assistant turn and tokenises all of it again (the
system prompt and tools come from the per-process head cache). That is the proxy's slow path,
so the overhead here bounds from above that of a harness that sends its turns back unchanged
(one render and the new messages tokenised per call). The prompt ids stay consistent: call
k's ids are a token prefix of call k + 1's (`prompt_extends`), so the engine's cache reuses
the whole previous prompt; the generated tokens it also cached diverge from the scripted turn
and are not reused (in a real loop they would be).

The client runs in the same process as the proxy and the engine (as the run's coordinator
runs the proxy next to its reference engines), so the overhead includes the client's share
of the GIL; the load average is reported next to the numbers.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from gyre.benches.agent_sessions import DEFAULT_RESULT_CHARS, AgentSession, agent_sessions
from gyre.config.run import RolloutConfig
from gyre.engines.base import GenerationRequest, GenerationResult, SamplingParams
from gyre.engines.torch.prefix_cache import PrefixCache, PrefixMatch
from gyre.engines.torch.rollout import TorchRolloutEngine

DEFAULT_SESSIONS = 8
DEFAULT_TURNS = 6
DEFAULT_CONCURRENCY = 8
DEFAULT_PAIRED_SESSIONS = 2
DEFAULT_MAX_TOKENS = 8
DEFAULT_CACHE_BYTES: int = RolloutConfig.model_fields["prefix_cache_bytes"].default
"""`rollout.prefix_cache_bytes`' default (1 GiB)."""
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}

Timings = dict[tuple[str, int], float]
"""(session id, call k) -> seconds."""


class CountingPrefixCache(PrefixCache):
    """The engine's prefix cache, also keeping each lookup's hit length by prompt, so the
    benchmark can say per call what the cache saved (`hit_tokens` counts only the sum)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.hits: dict[tuple[int, ...], int] = {}

    def match(self, tokens, limit: int | None = None) -> PrefixMatch:
        found = super().match(tokens, limit)
        self.hits[tuple(tokens)] = found.length
        return found


class TimedEngine:
    """The engine as the proxy's router sees it, timing each `generate` (seconds by prompt):
    what a proxy call spent in the engine, to subtract from its round trip."""

    def __init__(self, inner: TorchRolloutEngine) -> None:
        self.inner = inner
        self.engine_id = inner.engine_id
        self.seconds: dict[tuple[int, ...], float] = {}

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def generate(self, request: GenerationRequest) -> GenerationResult:
        started = time.perf_counter()
        result = self.inner.generate(request)
        self.seconds[tuple(request.prompt_ids)] = time.perf_counter() - started
        return result

    def load_weights(self, snapshot: Path, version: int) -> None:
        self.inner.load_weights(snapshot, version)

    def close(self) -> None:
        self.inner.close()


@dataclass
class _Stack:
    """One engine behind its own proxy."""

    label: str
    engine: TorchRolloutEngine
    timed: TimedEngine
    registry: object  # SessionRegistry
    server: object  # ServerThread
    counters: dict[str, int] = field(default_factory=dict)

    def cold(self) -> None:
        """Empty the prefix cache (each replay starts cold), note its counters, forget timings."""
        self.timed.seconds.clear()
        cache = self.engine.prefix_cache
        if cache is not None:
            cache.clear()
            cache.hits.clear()
            self.counters = {"hit_tokens": cache.hit_tokens, "miss_tokens": cache.miss_tokens}

    def cache_delta(self) -> dict[str, int]:
        cache = self.engine.prefix_cache
        if cache is None:
            return {"hit_tokens": 0, "miss_tokens": 0}
        return {k: getattr(cache, k) - v for k, v in self.counters.items()}

    def close(self) -> None:
        self.server.stop()
        self.engine.close()


def _stack(label: str, model_dir: Path, tokenizer, cache_bytes: int, concurrency: int) -> _Stack:
    from gyre.engines.models.hf import stop_token_ids
    from gyre.net.server_thread import ServerThread
    from gyre.proxy.app import create_app
    from gyre.proxy.router import EngineRouter
    from gyre.proxy.sessions import SessionRegistry

    engine = TorchRolloutEngine(model_dir, engine_id=f"torch-{label}", max_batch_size=concurrency,
                                prefix_cache_bytes=cache_bytes)
    if cache_bytes > 0:
        engine.prefix_cache = CountingPrefixCache(cache_bytes)
    timed = TimedEngine(engine)
    registry = SessionRegistry()
    app = create_app(EngineRouter([timed]), registry, tokenizer, model_name="gyre",
                     stop_token_ids=stop_token_ids(tokenizer), max_context_tokens=engine.max_context)
    return _Stack(label, engine, timed, registry, ServerThread(app, name=f"gyre-bench-{label}").start())


def _client(stack: _Stack, connections: int):
    import httpx

    return httpx.AsyncClient(base_url=f"http://{stack.server.host}:{stack.server.port}", timeout=600.0,
                             limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))


async def _post(client, session: AgentSession, k: int, key: str, max_tokens: int) -> float:
    """Call k of `session` through the proxy; seconds from sending to the whole answer read."""
    body = orjson.dumps(session.body(k, max_tokens))  # the harness's work, not timed
    headers = {"content-type": "application/json",
               **({"authorization": f"Bearer {key}"} if session.api == "openai" else {"x-api-key": key})}
    started = time.perf_counter()
    response = await client.post(PATHS[session.api], content=body, headers=headers)
    response.read()
    seconds = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"{session.session_id} call {k}: proxy answered {response.status_code}: "
                           f"{response.text[:300]}")
    return seconds


async def _proxy_replay(stack: _Stack, sessions: list[AgentSession], run_id: str, concurrency: int,
                        max_tokens: int) -> tuple[Timings, dict[str, tuple[list, int]]]:
    """Each session's calls in order through the proxy, C sessions at a time. Returns the
    timings and, per session, the calls the proxy recorded and its fallback turns."""
    keys = {s.session_id: stack.registry.mint(f"{run_id}-{s.session_id}") for s in sessions}
    timings: Timings = {}
    gate = asyncio.Semaphore(concurrency)
    async with _client(stack, concurrency) as client:

        async def replay(session: AgentSession) -> None:
            async with gate:
                for k in range(1, session.turns + 1):
                    timings[(session.session_id, k)] = await _post(
                        client, session, k, keys[session.session_id], max_tokens)

        await asyncio.gather(*(replay(s) for s in sessions))
    closed = {s.session_id: stack.registry.close(f"{run_id}-{s.session_id}") for s in sessions}
    return timings, {sid: (c.calls, c.fallback_turns) for sid, c in closed.items()}


async def _paired_replay(stack: _Stack, sessions: list[AgentSession], max_tokens: int,
                         params: SamplingParams) -> list[dict]:
    """One call at a time: through the proxy, then the prompt ids it built straight into the
    engine, twice, in the order proxy, direct, direct, proxy (drift hits both alike); the best
    of each pair (a busy box only ever adds time). Returns per call the two times
    (milliseconds) and the output lengths (proxy, direct)."""
    out = []
    async with _client(stack, 1) as client:
        for session in sessions:
            key = stack.registry.mint(f"paired-{session.session_id}")
            recorded = stack.registry.session(key)
            for k in range(1, session.turns + 1):
                proxy_s = [await _post(client, session, k, key, max_tokens)]
                call = recorded.calls[-1]
                direct_s = []
                for _ in range(2):  # blocks this loop on purpose: nothing else runs on it
                    started = time.perf_counter()
                    direct = stack.engine.generate(GenerationRequest(call.prompt_ids, params))
                    direct_s.append(time.perf_counter() - started)
                proxy_s.append(await _post(client, session, k, key, max_tokens))
                out.append({"session": session.session_id, "api": session.api, "k": k,
                            "proxy_ms": _ms(min(proxy_s)), "direct_ms": _ms(min(direct_s)),
                            "output_tokens": [len(call.output_ids), len(direct.output_ids)]})
            stack.registry.close(f"paired-{session.session_id}")
    return out


async def _warm(stack: _Stack, session: AgentSession, max_tokens: int) -> None:
    """The session's last call alone: the engine's first prefill of that length is slower
    (buffers of new sizes), and it must not land in the first measured replay."""
    key = stack.registry.mint(f"warmup-last-{session.session_id}")
    async with _client(stack, 1) as client:
        await _post(client, session, session.turns, key, max_tokens)
    stack.registry.close(f"warmup-last-{session.session_id}")


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def run(
    sessions: int = DEFAULT_SESSIONS,
    turns: int = DEFAULT_TURNS,
    concurrency: int = DEFAULT_CONCURRENCY,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: int = 0,
    api: str = "mixed",
    result_chars: tuple[int, int] = DEFAULT_RESULT_CHARS,
    model_dir: Path | None = None,
    cache_dir: Path | None = None,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    paired_sessions: int = DEFAULT_PAIRED_SESSIONS,
) -> dict:
    """Replay the sessions with and without the cache, then pair proxy and direct calls on the
    first `paired_sessions`; returns the figures (module docstring).
    `model_dir`: a model directory (default: the bundled tiny model, built under `cache_dir`,
    default a temporary directory)."""
    from gyre.engines.models.hf import load_tokenizer, stop_token_ids
    from gyre.engines.models.tiny import cached_tiny_model

    if model_dir is None:
        model_dir = cached_tiny_model(cache_dir or Path(tempfile.gettempdir()) / "gyre-bench-models")
    tokenizer = load_tokenizer(model_dir)
    plan = agent_sessions(sessions, turns, seed, api=api, result_chars=result_chars)
    warmup = [*agent_sessions(2, 2, seed + 1, result_chars=(200, 400)),
              agent_sessions(1, turns, seed + 2, result_chars=result_chars)[0]]
    params = SamplingParams(temperature=0.0, max_new_tokens=max_tokens, stop_token_ids=stop_token_ids(tokenizer))
    stacks = {"cache": _stack("cache", model_dir, tokenizer, cache_bytes, concurrency),
              "no_cache": _stack("nocache", model_dir, tokenizer, 0, concurrency)}
    load_before = os.getloadavg()[0]
    replays: dict[str, dict] = {}
    try:
        for label, stack in stacks.items():  # small calls, then one as long as the longest ones
            asyncio.run(_proxy_replay(stack, warmup[:2], f"warmup-{label}", concurrency, max_tokens))
            asyncio.run(_warm(stack, warmup[2], max_tokens))
        for label, stack in stacks.items():
            stack.cold()
            started = time.perf_counter()
            timings, recorded = asyncio.run(_proxy_replay(stack, plan, label, concurrency, max_tokens))
            replays[label] = dict(
                proxy=timings, wall_s=round(time.perf_counter() - started, 2),
                engine=dict(stack.timed.seconds), engine_cache=stack.cache_delta(),
                hits=dict(stack.engine.prefix_cache.hits) if stack.engine.prefix_cache is not None else {},
                prompts={sid: [c.prompt_ids for c in calls] for sid, (calls, _) in recorded.items()},
                fallback_turns=sum(f for _, f in recorded.values()),
                output_tokens=sum(len(c.output_ids) for calls, _ in recorded.values() for c in calls))
        paired = asyncio.run(_paired_replay(stacks["no_cache"], plan[:paired_sessions], max_tokens, params))
    finally:
        for stack in stacks.values():
            stack.close()
    return _figures(replays, paired, plan, dict(
        sessions=sessions, turns=turns, concurrency=concurrency, max_tokens=max_tokens, seed=seed, api=api,
        result_chars=list(result_chars), cache_bytes=cache_bytes, paired_sessions=len(plan[:paired_sessions]),
        model=str(model_dir), load_avg_1m_before=round(load_before, 2), load_avg_1m_after=round(os.getloadavg()[0], 2),
        cpu_count=os.cpu_count()))


def _calls(replays: dict, plan: list[AgentSession]) -> list[dict]:
    """One record per (session, k): sizes, the cache's hit, milliseconds through the proxy and
    inside `engine.generate`, with and without the cache."""
    out = []
    for s in plan:
        for k in range(1, s.turns + 1):
            ids = replays["cache"]["prompts"][s.session_id][k - 1]
            previous = len(replays["cache"]["prompts"][s.session_id][k - 2]) if k > 1 else 0
            record = {"session": s.session_id, "api": s.api, "k": k, "prompt_tokens": len(ids),
                      "new_tokens": len(ids) - previous,
                      "cache_hit_tokens": replays["cache"]["hits"].get(tuple(ids), 0)}
            for label, r in replays.items():
                own = tuple(r["prompts"][s.session_id][k - 1])
                record.update({f"proxy_{label}_ms": _ms(r["proxy"][(s.session_id, k)]),
                               f"engine_{label}_ms": _ms(r["engine"][own])})
            out.append(record)
    return out


def _stats(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(_pct(values, 50), 2), "p95_ms": round(_pct(values, 95), 2), "n": len(values)}


def _figures(replays: dict, paired: list[dict], plan: list[AgentSession], config: dict) -> dict:
    calls = _calls(replays, plan)
    per_call = []
    for k in range(1, config["turns"] + 1):
        rows = [c for c in calls if c["k"] == k]

        def p50(key: str) -> float:
            return round(_pct([c[key] for c in rows], 50), 1)

        with_cache, without = p50("proxy_cache_ms"), p50("proxy_no_cache_ms")
        per_call.append({
            "k": k, "prompt_tokens": round(p50("prompt_tokens")), "new_tokens": round(p50("new_tokens")),
            "cache_hit_tokens": round(p50("cache_hit_tokens")),
            "proxy_cache_ms": with_cache, "proxy_no_cache_ms": without,
            "cache_speedup": round(without / with_cache, 2) if with_cache > 0 else None,
            "engine_cache_ms": p50("engine_cache_ms"), "engine_no_cache_ms": p50("engine_no_cache_ms"),
        })
    overhead = {}
    for name, api in (("vs_direct", None), ("vs_direct_openai", "openai"), ("vs_direct_anthropic", "anthropic")):
        if diffs := [c["proxy_ms"] - c["direct_ms"] for c in paired if api in (None, c["api"])]:
            overhead[name] = _stats(diffs)
    for label in replays:
        overhead[f"in_call_{label}"] = _stats([c[f"proxy_{label}_ms"] - c[f"engine_{label}_ms"] for c in calls])
    prompts = replays["cache"]["prompts"]
    return {
        "config": config,
        "per_call": per_call,
        "overhead": overhead,
        "replays": {label: {k: r[k] for k in ("wall_s", "engine_cache", "fallback_turns", "output_tokens")}
                    for label, r in replays.items()},
        "tito_fallback_turns_expected": sum(k - 1 for s in plan for k in range(1, s.turns + 1)),
        "prompt_extends": all(later[: len(earlier)] == earlier for ids in prompts.values()
                              for earlier, later in zip(ids, ids[1:])),
        "same_prompts_with_and_without_cache": prompts == replays["no_cache"]["prompts"],
        "calls": calls,
        "paired": paired,
    }


PER_CALL_COLUMNS = (
    ("k", "k"), ("prompt_tokens", "prompt tok"), ("new_tokens", "new tok"), ("cache_hit_tokens", "hit tok"),
    ("proxy_cache_ms", "proxy ms cache"), ("proxy_no_cache_ms", "proxy ms none"), ("cache_speedup", "speedup"),
    ("engine_cache_ms", "engine ms cache"), ("engine_no_cache_ms", "engine ms none"),
)
"""(key, heading) of the per-call table: medians over sessions of the k-th call; "hit tok": the
prefix cache's hit; "cache" / "none": with / without the prefix cache; "engine": the time that
call spent inside `engine.generate`."""


def summary_rows(result: dict) -> list[tuple[str, str]]:
    """(figure, value) rows for the summary table."""
    o, c = result["overhead"], result["config"]
    names = {"vs_direct": f"proxy - direct, same prompt, sequential ({c['paired_sessions']} sessions)",
             "vs_direct_openai": "  openai", "vs_direct_anthropic": "  anthropic",
             "in_call_cache": "proxy - engine time in the call, concurrent (cache)",
             "in_call_no_cache": "proxy - engine time in the call, concurrent (no cache)"}
    rows = [(f"{names[key]}: p50 / p95 ms", f"{v['p50_ms']} / {v['p95_ms']} (n={v['n']})") for key, v in o.items()]
    for label, r in result["replays"].items():
        rows.append((f"replay wall s ({label})", f"{r['wall_s']}"))
    cache = result["replays"]["cache"]["engine_cache"]
    rows += [("engine cache hit / miss tokens (cache replay)", f"{cache['hit_tokens']} / {cache['miss_tokens']}"),
             ("TITO fallback turns, each replay (scripted history)",
              f"{result['replays']['cache']['fallback_turns']} of {result['tito_fallback_turns_expected']} expected"),
             ("each prompt extends the previous", str(result["prompt_extends"])),
             ("sessions x calls, concurrency, max_tokens",
              f"{c['sessions']} x {c['turns']}, {c['concurrency']}, {c['max_tokens']}"),
             ("load avg 1m before / after", f"{c['load_avg_1m_before']} / {c['load_avg_1m_after']} "
              f"({c['cpu_count']} CPUs)")]
    return rows
