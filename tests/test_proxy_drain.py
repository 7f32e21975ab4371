"""Keeping executions alive while engines come and go: drain, failure, no engine, disconnect.

Draining an engine under 8 in-flight streaming requests (official SDKs, real tiny model on
two engines): every request completes with all its tokens, the records show both engines,
and each continued request was resubmitted as prompt + tokens so far.
"""

from __future__ import annotations

import threading
import time

import anthropic
import httpx
import openai
import pytest

from gyre.engines.torch.rollout import TorchRolloutEngine
from gyre.proxy.generation import MAX_ENGINE_FAILURES
from gyre.storage.store import RunStore
from tests.fakes import BrokenEngine, ScriptedEngine, SpyEngine, serve_proxy

MAX_TOKENS = 40


def _wait_for(predicate, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.mark.slow
def test_drain_moves_eight_streaming_requests_to_the_other_engine(tiny_model_dir, tiny_tokenizer):
    a = SpyEngine(TorchRolloutEngine(tiny_model_dir, engine_id="torch-a", seed=1))
    b = SpyEngine(TorchRolloutEngine(tiny_model_dir, engine_id="torch-b", seed=2))
    # no stop tokens: every request runs to MAX_TOKENS, so all are in flight at the drain
    server, sessions, router = serve_proxy([a, b], tiny_tokenizer, stop_token_ids=())
    keys = {f"exec-{i}": sessions.mint(f"exec-{i}") for i in range(8)}
    texts: dict[str, str] = {}
    errors: list[BaseException] = []

    def run_openai(eid):
        client = openai.OpenAI(base_url=server.base_url, api_key=keys[eid], max_retries=0)
        stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": eid}],
                                                max_tokens=MAX_TOKENS, stream=True)
        texts[eid] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    def run_anthropic(eid):
        client = anthropic.Anthropic(base_url=server.base_url[:-3], api_key=keys[eid], max_retries=0)
        with client.messages.stream(model="tiny", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": eid}]) as s:
            texts[eid] = "".join(s.text_stream)

    def guarded(fn, eid):
        try:
            fn(eid)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(run_openai if i % 2 else run_anthropic, f"exec-{i}"))
               for i in range(8)]
    try:
        for t in threads:
            t.start()
        _wait_for(lambda: router.load() == {"torch-a": 4, "torch-b": 4} and a.tokens_sampled >= 8)
        assert router.drain("torch-a", timeout_s=30)
        assert router.load()["torch-a"] == 0
        for t in threads:
            t.join(timeout=120)
    finally:
        server.stop()
        a.close()
        b.close()
    assert not errors, errors
    calls = {eid: sessions.close(eid).calls for eid in keys}
    assert all(len(c) == 1 for c in calls.values())  # no execution lost, none doubled
    engines_seen = set()
    moved = 0
    for eid, (call,) in calls.items():
        assert len(call.output_ids) == MAX_TOKENS and call.finish_reason == "length"
        assert texts[eid] == tiny_tokenizer.decode(call.output_ids, skip_special_tokens=False)
        engines_seen |= {s.engine_id for s in call.segments}
        if [s.engine_id for s in call.segments] == ["torch-a", "torch-b"]:
            moved += 1
            cut = call.segments[0].end
            # resubmitted as prompt + tokens so far: exactly that prompt reached engine b
            assert any(r.prompt_ids == call.prompt_ids + call.output_ids[:cut] for r in b.requests)
    assert engines_seen == {"torch-a", "torch-b"}
    assert moved >= 1 and all(call.segments[-1].engine_id == "torch-b" for (call,) in calls.values())


def test_engine_failure_continues_on_another_engine_from_the_tokens_so_far(tiny_tokenizer, tmp_path):
    reported = tiny_tokenizer("partial ", add_special_tokens=False)["input_ids"]
    broken = BrokenEngine(reported, engine_id="a-broken")
    good = ScriptedEngine(tiny_tokenizer, ["rest"], engine_id="b-good")
    server, sessions, _ = serve_proxy([broken, good], tiny_tokenizer)
    key = sessions.mint("e")
    try:
        r = httpx.post(f"{server.base_url}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    finally:
        server.stop()
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "partial rest"
    (call,) = sessions.close("e").calls
    assert [s.engine_id for s in call.segments] == ["a-broken", "b-good"]
    assert good.prompts[-1] == call.prompt_ids + reported
    assert call.logprobs[: len(reported)] == [-0.5] * len(reported)
    store = RunStore(tmp_path / "gyre.duckdb")  # the run's record shows both engines
    store.append_calls([call])
    assert store.query("select engine_id, output_start, output_end from call_segments order by segment_index") == [
        ("a-broken", 0, len(reported)), ("b-good", len(reported), len(call.output_ids))]
    store.close()


def test_engine_failures_past_the_budget_are_an_api_error_and_an_abort_record(tiny_tokenizer):
    broken = BrokenEngine([5, 6], engine_id="only")
    server, sessions, _ = serve_proxy([broken], tiny_tokenizer)
    key = sessions.mint("e")
    try:
        r = httpx.post(f"{server.base_url}/messages", headers={"x-api-key": key}, timeout=30,
                       json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    finally:
        server.stop()
    assert r.status_code == 502 and r.json()["error"]["type"] == "api_error"
    assert broken.calls == MAX_ENGINE_FAILURES + 1
    (call,) = sessions.close("e").calls
    assert call.finish_reason == "abort"  # never passed off as complete
    assert call.output_ids == [5, 6] * (MAX_ENGINE_FAILURES + 1)


def test_requests_wait_for_an_engine_then_fail_cleanly(tiny_tokenizer):
    server, sessions, router = serve_proxy([], tiny_tokenizer, max_wait_s=0.3)
    key = sessions.mint("e")
    body = {"messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {key}"}
    try:
        r = httpx.post(f"{server.base_url}/chat/completions", headers=headers, json=body, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        r = httpx.post(f"{server.base_url}/messages", headers={"x-api-key": key}, timeout=30,
                       json={"max_tokens": 4, **body})
        assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
        router.max_wait_s = 10.0
        threading.Timer(0.2, router.register, [ScriptedEngine(tiny_tokenizer, ["late"])]).start()
        r = httpx.post(f"{server.base_url}/chat/completions", headers=headers, json=body, timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "late"
    finally:
        server.stop()


@pytest.mark.slow
def test_client_disconnect_mid_stream_stops_the_engine_and_records_an_abort(tiny_model_dir, tiny_tokenizer):
    engine = TorchRolloutEngine(tiny_model_dir, engine_id="torch-d", seed=3)
    server, sessions, router = serve_proxy([engine], tiny_tokenizer, stop_token_ids=())
    key = sessions.mint("e")
    try:
        with httpx.stream("POST", f"{server.base_url}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2000, "stream": True},
                          timeout=30) as r:
            assert r.status_code == 200
            next(r.iter_lines())
        session = sessions.session(key)
        _wait_for(lambda: len(session.calls) == 1, timeout_s=20)
        assert router.load() == {"torch-d": 0}
    finally:
        server.stop()
        engine.close()
    (call,) = sessions.close("e").calls
    assert call.finish_reason == "abort" and len(call.output_ids) < 2000
