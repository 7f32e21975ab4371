"""The proxy over real HTTP: auth, OpenAI shapes, tool calls, and exact token recording."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from gyre.engines.models.hf import stop_token_ids
from gyre.engines.torch.rollout import TorchRolloutEngine
from gyre.net.server_thread import ServerThread
from gyre.proxy.app import create_app
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import SessionRegistry
from gyre.proxy.toolcalls import QwenToolCallParser
from gyre.trajectories.chains import build_trajectories
from tests.fakes import ScriptedEngine


def _serve(engine, tokenizer):
    sessions = SessionRegistry()
    app = create_app(EngineRouter([engine]), sessions, tokenizer, model_name="tiny",
                     stop_token_ids=stop_token_ids(tokenizer))
    return ServerThread(app).start(), sessions


def _post(server, key, body):
    return httpx.post(f"{server.base_url}/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {key}"}, timeout=60)


def test_multi_turn_calls_record_exact_sampled_tokens(tiny_model_dir, tiny_tokenizer):
    engine = TorchRolloutEngine(tiny_model_dir, seed=7)
    server, sessions = _serve(engine, tiny_tokenizer)
    key = sessions.mint("exec-1")
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "make calc.py"}]
    try:
        for turn in range(4):
            r = _post(server, key, {"model": "tiny", "messages": messages, "max_tokens": 24})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "chat.completion"
            messages += [body["choices"][0]["message"], {"role": "user", "content": f"go on {turn}"}]
    finally:
        server.stop()
        engine.close()
    session = sessions.close("exec-1")
    calls = session.calls
    assert len(calls) == 4 and all(c.execution_id == "exec-1" for c in calls)
    for earlier, later in zip(calls, calls[1:]):
        # TITO: the sampled ids come back verbatim inside the next prompt
        n = len(earlier.prompt_ids) + len(earlier.output_ids)
        assert later.prompt_ids[:n] == earlier.prompt_ids + earlier.output_ids
    assert session.fallback_turns == 0
    (traj,) = build_trajectories(calls)
    assert sum(traj.trainable) == sum(len(c.output_ids) for c in calls)


def test_edited_assistant_turn_falls_back_to_template_tokens(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["first answer", "second"])
    server, sessions = _serve(engine, tiny_tokenizer)
    key = sessions.mint("e")
    messages = [{"role": "user", "content": "hi"}]
    try:
        r = _post(server, key, {"messages": messages})
        edited = dict(r.json()["choices"][0]["message"], content="an edited answer")
        assert _post(server, key, {"messages": messages + [edited, {"role": "user", "content": "more"}]}).status_code == 200
    finally:
        server.stop()
    assert sessions.close("e").fallback_turns == 1


def test_tool_calls_come_back_in_openai_shape_and_garbage_stays_text(tiny_tokenizer):
    reply = '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py", "content": "x = 1\\n"}}\n</tool_call>'
    engine = ScriptedEngine(tiny_tokenizer, [reply, "<tool_call>{not json</tool_call>"])
    server, sessions = _serve(engine, tiny_tokenizer)
    key = sessions.mint("e")
    try:
        r = _post(server, key, {"messages": [{"role": "user", "content": "hi"}], "tools": []})
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (tc,) = choice["message"]["tool_calls"]
        assert tc["type"] == "function" and tc["function"]["name"] == "write_file"
        assert json.loads(tc["function"]["arguments"]) == {"path": "a.py", "content": "x = 1\n"}
        r = _post(server, key, {"messages": [{"role": "user", "content": "again"}]})
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"] == "<tool_call>{not json</tool_call>"
        assert "tool_calls" not in r.json()["choices"][0]["message"]
    finally:
        server.stop()


def test_auth_and_bad_requests_get_openai_errors(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, [])
    server, sessions = _serve(engine, tiny_tokenizer)
    key_a, key_b = sessions.mint("a"), sessions.mint("b")
    try:
        r = _post(server, "wrong", {"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = httpx.post(f"{server.base_url}/chat/completions", json={"messages": []}, timeout=10)
        assert r.status_code in (400, 401)
        for bad in ({"messages": []}, {"messages": [{"role": "wizard", "content": "x"}]},
                    {"messages": [{"role": "user", "content": "x"}], "temperature": -1},
                    {"messages": [{"role": "user", "content": "x"}], "n": 2}, "not json"):
            r = _post(server, key_a, bad)
            assert r.status_code == 400, (bad, r.text)
            assert r.json()["error"]["message"]
        assert _post(server, key_b, {"messages": [{"role": "user", "content": "x"}]}).status_code == 200
        assert httpx.get(f"{server.base_url}/models").json()["data"][0]["id"] == "tiny"
    finally:
        server.stop()
    assert sessions.close("a").calls == []  # nothing from key b landed in execution a
    assert len(sessions.close("b").calls) == 1


@pytest.mark.parametrize("text", ["plain", "<tool_call>[1]</tool_call>", '<tool_call>{"name": 3}</tool_call>',
                                  '<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>'])
def test_parser_never_raises_on_malformed_calls(text):
    content, calls = QwenToolCallParser().parse(text)
    assert content == text and calls == []


def test_records_keep_the_prompt_each_call_sent_whether_its_output_was_finished_inline_or_in_a_lane(tiny_tokenizer):
    """A short output is decoded and recorded on the event loop, a long one in a prompt lane
    (`INLINE_FINISH_TOKENS`); either way the record holds the prompt list the engine was given,
    handed over uncopied, and later calls of the execution (their prompts grow from it) never
    change it."""
    from gyre.proxy.completion import INLINE_FINISH_TOKENS

    long_reply = " ".join(f"word{i}" for i in range(INLINE_FINISH_TOKENS))
    engine = ScriptedEngine(tiny_tokenizer, ["short", long_reply, "short again", long_reply])
    server, sessions = _serve(engine, tiny_tokenizer)
    key = sessions.mint("e")
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    try:
        for turn in range(4):
            r = _post(server, key, {"messages": messages, "max_tokens": 4 * INLINE_FINISH_TOKENS})
            assert r.status_code == 200, r.text
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"more {turn}"}]
    finally:
        server.stop()
    session = sessions.close("e")
    calls = session.calls
    assert [len(c.output_ids) > INLINE_FINISH_TOKENS for c in calls] == [False, True, False, True]
    assert [c.prompt_ids for c in calls] == engine.prompts  # the engine kept copies as it was called
    assert messages[4]["content"] == long_reply and messages[6]["content"] == "short again"
    assert session.fallback_turns == 0


def test_calls_on_an_engine_that_takes_requests_without_blocking_hold_none_of_the_proxys_threads(
        tiny_model_dir, tiny_tokenizer):
    """The torch engine offers `submit` (`engines.base.Submits`): the proxy awaits its future, so the calls
    in flight are not bounded by the proxy's engine threads. With one such thread, three concurrent calls
    still all reach the paused engine's queue, and all are answered once it resumes."""
    engine = TorchRolloutEngine(tiny_model_dir, seed=5)
    submitted = []
    take = engine.submit
    engine.submit = lambda request: (submitted.append(len(request.prompt_ids)), take(request))[1]
    sessions = SessionRegistry()
    app = create_app(EngineRouter([engine]), sessions, tiny_tokenizer, model_name="tiny",
                     stop_token_ids=stop_token_ids(tiny_tokenizer), max_concurrent_requests=1)
    server = ServerThread(app).start()
    engine.pause()
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = [pool.submit(_post, server, sessions.mint(f"exec-{i}"),
                                   {"model": "tiny", "max_tokens": 4,
                                    "messages": [{"role": "user", "content": f"task {i}"}]}) for i in range(3)]
            deadline = time.monotonic() + 30
            while len(submitted) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(submitted) == 3 and not any(a.done() for a in answers)  # all queued at the paused engine
            engine.resume()
            assert [a.result(timeout=60).status_code for a in answers] == [200, 200, 200]
    finally:
        server.stop()
        engine.close()
    assert sorted(len(sessions.close(f"exec-{i}").calls) for i in range(3)) == [1, 1, 1]
