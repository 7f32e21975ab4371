"""`gyre bench proxy-sessions`, `proxy-long-call`, `proxy-echo`: agent-shaped sessions replayed through the proxy.

The generator's sessions are well-formed in both API shapes, carry the same conversation in
both, and each call's prompt extends the previous one (as messages and as the proxy's token
ids); the replay runs end to end through the real proxy to the tiny model and reports the
k-th call's time with and without the prefix cache and the proxy's overhead; with the cache,
every later call reuses at least the whole previous prompt (the engine's own counters).
"""

from __future__ import annotations

import json
import os
import tempfile

from typer.testing import CliRunner

from gyre.benches.agent_sessions import agent_sessions
from gyre.benches.proxy_sessions import run
from gyre.proxy import anthropic_api, openai_api
from gyre.proxy.gc_tuning import GC_THRESHOLD0
from gyre.proxy.prompt import PromptBuilder, TitoCache

SMALL = (200, 500)


def _template_messages(session, k):
    """Call k's conversation as the proxy's template messages, from each API shape."""
    oa = openai_api.ChatCompletionRequest.model_validate(session.openai_body(k, 8))
    an = anthropic_api.MessagesRequest.model_validate(session.anthropic_body(k, 8))
    from_openai = [openai_api.template_message(m, True) for m in oa.messages]
    from_anthropic = anthropic_api.template_messages(an, True)
    return from_openai, from_anthropic, [t.model_dump() for t in oa.tools], anthropic_api.template_tools(an.tools)


def test_sessions_are_deterministic_well_formed_and_growing(tiny_tokenizer):
    sessions = agent_sessions(3, 4, seed=1, result_chars=SMALL)
    assert sessions == agent_sessions(3, 4, seed=1, result_chars=SMALL)
    assert sessions != agent_sessions(3, 4, seed=2, result_chars=SMALL)
    assert [s.api for s in sessions] == ["openai", "anthropic", "openai"]
    builder = PromptBuilder(tiny_tokenizer)
    for session in sessions:
        assert session.turns == 4
        previous_messages, previous_ids = None, None
        for k in range(1, session.turns + 1):
            messages = session.openai_messages(k)
            assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
            for i, m in enumerate(messages):
                if m["role"] == "assistant":  # its tool calls are answered, in order, right after it
                    ids = [c["id"] for c in m["tool_calls"]]
                    answers = messages[i + 1 : i + 1 + len(ids)]
                    assert ids and [a["tool_call_id"] for a in answers] == ids
                    assert all(a["role"] == "tool" and a["content"] for a in answers)
                    assert all(isinstance(json.loads(c["function"]["arguments"]), dict) for c in m["tool_calls"])
            from_openai, from_anthropic, tools_oa, tools_an = _template_messages(session, k)
            assert from_openai == from_anthropic  # both shapes carry the same conversation
            assert [t["function"]["name"] for t in tools_oa] == [t["function"]["name"] for t in tools_an]
            prompt = builder.build(from_openai, tools_an, TitoCache())
            if previous_messages is not None:
                assert messages[: len(previous_messages)] == previous_messages
                assert prompt.ids[: len(previous_ids)] == previous_ids  # token prefix, too
                assert len(prompt.ids) - len(previous_ids) >= 100  # tool results of hundreds of tokens
            previous_messages, previous_ids = messages, prompt.ids


def test_replay_through_the_proxy_reports_cache_and_overhead(tiny_model_dir):
    result = run(2, 3, 2, max_tokens=4, model_dir=tiny_model_dir, result_chars=SMALL, paired_sessions=1)
    assert [row["k"] for row in result["per_call"]] == [1, 2, 3]
    for row in result["per_call"]:
        for key in ("proxy_cache_ms", "proxy_no_cache_ms", "engine_cache_ms", "engine_no_cache_ms"):
            assert row[key] > 0
        assert row["proxy_cache_ms"] >= row["engine_cache_ms"]
    overhead = result["overhead"]
    assert overhead["vs_direct"]["n"] == 3 and overhead["in_call_cache"]["n"] == 6
    assert {"p50_ms", "p95_ms"} <= overhead["vs_direct"].keys() and overhead["in_call_no_cache"]["p50_ms"] > 0
    assert result["prompt_extends"] and result["same_prompts_with_and_without_cache"]
    # the scripted assistant turns never match what the engine generated: each is a fallback
    assert result["replays"]["cache"]["fallback_turns"] == result["tito_fallback_turns_expected"] == 2 * (0 + 1 + 2)
    # with the cache, each later call reuses at least the whole previous prompt
    calls = {(c["session"], c["k"]): c for c in result["calls"]}
    for (session, k), call in calls.items():
        if k > 1:
            assert call["cache_hit_tokens"] >= calls[(session, k - 1)]["prompt_tokens"]
    hits = result["replays"]["cache"]["engine_cache"]["hit_tokens"]
    assert hits >= sum(c["cache_hit_tokens"] for c in result["calls"]) > 0
    assert result["replays"]["no_cache"]["engine_cache"] == {"hit_tokens": 0, "miss_tokens": 0}


def test_cli_bench_proxy_sessions_prints_tables(monkeypatch, tmp_path):
    from gyre.cli.main import app

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the tiny model is built under tmp_path
    result = CliRunner().invoke(app, ["bench", "proxy-sessions", "--sessions", "1", "--turns", "2",
                                      "--max-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert "the k-th call of a session" in result.output and "proxy - direct" in result.output
    result = CliRunner().invoke(app, ["bench", "proxy-long-call", "--session-tokens", "2000", "--json"])
    assert result.exit_code == 0, result.output
    long = json.loads(result.output)
    assert long["session_prompt_tokens"] >= 2000 and long["cache_hit_tokens"] >= long["session_prompt_tokens"]
    assert (tmp_path / "gyre-bench-models").is_dir()


def test_a_call_extending_a_long_session_reuses_the_whole_session_from_the_cache(tiny_model_dir):
    from gyre.benches.proxy_long_call import run as run_long_call

    result = run_long_call(session_tokens=3_000, extend_tokens=500, samples=4, model_dir=tiny_model_dir)
    assert result["session_prompt_tokens"] >= 3_000
    assert 200 < result["extended_prompt_tokens"] - result["session_prompt_tokens"] < 2_000
    assert result["cache_hit_tokens"] >= result["session_prompt_tokens"]  # the extending call prefilled only its tail
    assert result["same_output"]  # greedy: the same tokens with and without the cache
    assert result["extending_call_cached_s"] > 0 and result["extending_call_uncached_s"] > 0


def test_echoing_the_proxys_answers_keeps_every_turn_on_the_fast_path(tiny_tokenizer):
    """A harness that sends back the assistant message the proxy returned: no TITO fallback on any
    turn, so the proxy tokenises only what is new (`gyre bench proxy-echo` measures that path)."""
    import asyncio

    from gyre.benches.proxy import NullEngine, _output_ids
    from gyre.benches.proxy_echo import RawClient, replay
    from gyre.engines.models.hf import stop_token_ids
    from gyre.net.server_thread import ServerThread
    from gyre.proxy.app import create_app
    from gyre.proxy.router import EngineRouter
    from gyre.proxy.sessions import SessionRegistry

    registry = SessionRegistry()
    app = create_app(EngineRouter([NullEngine(_output_ids(tiny_tokenizer))]), registry, tiny_tokenizer,
                     model_name="null", stop_token_ids=stop_token_ids(tiny_tokenizer))
    server = ServerThread(app).start()
    session = agent_sessions(1, 5, 0, api="openai", result_chars=(2000, 3000))[0]
    key = registry.mint("echo")
    try:
        async def go():
            async with RawClient(server.port) as client:
                return await replay(client, key, session)

        calls = asyncio.run(go())
    finally:
        server.stop()
    closed = registry.close("echo")
    assert len(calls) == 5 and [b for b, _ in calls] == sorted(b for b, _ in calls)  # the context grows
    assert len(closed.calls) == 5 and closed.fallback_turns == 0
    # every message validated once (`message_cache.py`): the null engine calls no tool, so each
    # call adds its answer and one user message to the conversation
    assert closed.messages.validated == len(session.openai_messages(1)) + 2 * 4
    prompts = [c.prompt_ids for c in closed.calls]
    for before, after, call in zip(prompts, prompts[1:], closed.calls):
        assert after[: len(before) + len(call.output_ids)] == before + call.output_ids  # token-in/token-out


def test_cli_bench_proxy_echo_reports_the_overhead():
    from gyre.cli.main import app

    result = CliRunner().invoke(app, ["bench", "proxy-echo", "--concurrency", "2", "--long-tokens", "3000", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["sessions"] == 2 and figures["calls"] == 2 * figures["turns"] and figures["turns"] >= 2
    assert 0 < figures["p50_overhead_ms"] <= figures["p99_overhead_ms"]
    assert 0 < figures["sequential_p50_ms"] <= figures["sequential_p99_ms"]
    assert 0 < figures["tokenize_new_p50_ms"] <= figures["tokenize_new_p99_ms"]
    assert 0 < figures["tokenize_new_fast_p50_ms"] <= figures["tokenize_new_fast_p99_ms"]
    assert figures["tokenize_new_fast_warm_p50_ms"] > 0
    # the sequential calls' overhead over tokenising their own new text, and the proxy's CPU at once
    assert "sequential_over_tokenize_p50_ms" in figures and figures["concurrent_proxy_cpu_cores"] > 0
    assert 0 < figures["concurrent_client_cpu_cores"] <= figures["cpu_count"]
    # the busiest threads, most first, each a part of the process's CPU (the ticks of one thread are in its total);
    # each reading is whole clock ticks, so each figure is off by up to one tick over the phase (0.04 s here: a
    # quarter of a core), the sum of the threads' and the process's by up to one each (CI at load 8 read 1.28 and
    # 0.85 with a tolerance of 0.02)
    busiest = figures["concurrent_busiest_thread_cores"]
    tick = figures["concurrent_cpu_resolution_cores"]
    assert 0 < tick <= 1 / os.sysconf("SC_CLK_TCK") / (figures["wall_s"] - 0.005)
    assert 1 <= len(busiest) <= 3 and busiest == sorted(busiest, reverse=True)
    assert 0 <= busiest[-1] and sum(busiest) <= figures["concurrent_proxy_cpu_cores"] + (len(busiest) + 1) * tick + 0.02
    assert figures["gc_threshold"] == GC_THRESHOLD0  # served as `gyre proxy serve` serves (`proxy/gc_tuning.py`)
    baseline = CliRunner().invoke(app, ["bench", "proxy-echo", "--concurrency", "1", "--long-tokens", "3000", "--json",
                                        "--python-gc"])
    assert baseline.exit_code == 0, baseline.output
    assert json.loads(baseline.output)["gc_threshold"] is None


def test_each_tokenising_baseline_meets_each_text_first_with_the_servers_vocabulary():
    """The two baselines tokenise with tokenizers of their own (a BPE tokenizer caches the words it has merged, so a
    baseline timed after the other on the same tokenizer would be warm); both give the server's ids."""
    from gyre.benches.proxy import _tokenizer
    from gyre.benches.proxy_echo import _Tokenize

    tokenize, text = _Tokenize(), "def f(x):\n    return x + 1  # a tool result\n" * 40
    tokenize(text)
    assert tokenize._plain is not tokenize._fast
    expected = _tokenizer().backend_tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenize._plain.encode(text, add_special_tokens=False).ids == expected
    assert tokenize._fast.encode_batch_fast([text], add_special_tokens=False)[0].ids == expected
    assert len(tokenize.plain_ms) == len(tokenize.fast_ms) == 1 and min(tokenize.plain_ms + tokenize.fast_ms) > 0
    # the ways take turns going first (the second in a row runs with the library's code and tables warm), and each
    # baseline is read from the calls where its way went first
    tokenize(text + "x")
    tokenize(text + "y")
    assert tokenize.first == ["plain", "fast", "plain"]
    assert tokenize.when_first("plain", tokenize.plain_ms) == [tokenize.plain_ms[0], tokenize.plain_ms[2]]
    assert tokenize.when_first("fast", tokenize.fast_ms) == [tokenize.fast_ms[1]]
    assert tokenize.fast_warm_ms == [tokenize.fast_ms[0], tokenize.fast_ms[2]]
