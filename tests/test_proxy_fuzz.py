"""Bad input never crashes the proxy: hypothesis throws malformed bodies at both APIs.

Bodies are drawn from near-valid shapes (right keys, wrong types, odd blocks, huge or
negative numbers, unknown roles) and from arbitrary JSON and bytes. Every answer must be a
2xx or a 4xx in the API's own error shape; a 5xx fails the test.
"""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gyre.benches.proxy import NullEngine
from tests.fakes import serve_proxy

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
roles = st.sampled_from(["user", "assistant", "system", "tool", "developer", "wizard", 3, None])
block_types = st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", "redacted_thinking", "x", 7])
blocks = st.fixed_dictionaries({"type": block_types}, optional={
    "text": st.one_of(st.text(max_size=20), json_values), "id": json_values, "name": json_values,
    "input": json_values, "tool_use_id": json_values, "content": json_values, "thinking": json_values})
contents = st.one_of(st.text(max_size=30), st.lists(blocks, max_size=3), json_values)
tool_calls = st.lists(st.fixed_dictionaries({"id": json_values, "type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.one_of(st.text(max_size=8), json_values), "arguments": st.one_of(st.text(max_size=20), json_values)})}),
    max_size=2)
messages = st.lists(st.fixed_dictionaries({"role": roles}, optional={
    "content": contents, "tool_calls": tool_calls, "tool_call_id": json_values}), max_size=4)
numbers = st.one_of(st.integers(-5, 2**40), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3), st.none())
tools = st.one_of(st.none(), json_values, st.lists(st.fixed_dictionaries({}, optional={
    "type": st.just("function"), "function": json_values, "name": json_values, "input_schema": json_values}), max_size=2))
bodies = st.fixed_dictionaries({}, optional={
    "model": json_values, "messages": st.one_of(messages, json_values), "system": st.one_of(contents, json_values),
    "tools": tools, "max_tokens": numbers, "temperature": numbers, "stream": st.one_of(st.booleans(), json_values),
    "n": numbers, "thinking": json_values, "metadata": json_values, "stop": json_values, "stop_sequences": json_values,
    "top_p": numbers, "top_k": numbers, "tool_choice": json_values})

# near-valid bodies: these reach the template, the engine and the response builders
text = st.one_of(st.text(max_size=30), st.sampled_from(["<|im_end|>", "x<tool_call>{}</tool_call>", "<think>\ue000"]))
stops = st.lists(st.text(min_size=1, max_size=4), max_size=3)
args = st.dictionaries(st.text(max_size=5), scalars, max_size=3)
oa_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "developer", "assistant", "tool"]),
     "content": st.one_of(st.none(), text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2))},
    optional={"tool_calls": st.lists(st.fixed_dictionaries({"id": text, "type": st.just("function"), "function":
              st.fixed_dictionaries({"name": text, "arguments": st.one_of(text, args.map(str))})}), max_size=2),
              "tool_call_id": text, "reasoning_content": text})
oa_tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": text}, optional={"description": text, "parameters": args})})
openai_bodies = st.fixed_dictionaries({"messages": st.lists(oa_message, min_size=1, max_size=5)}, optional={
    "tools": st.lists(oa_tool, max_size=2), "max_tokens": st.integers(1, 64), "stream": st.booleans(),
    "temperature": st.floats(0, 2), "stream_options": st.just({"include_usage": True}), "logprobs": st.booleans(),
    "stop": st.one_of(st.text(min_size=1, max_size=4), stops), "top_p": st.floats(0, 1),
    "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "function": {"name": "f"}}])})
an_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": text, "name": text, "input": args}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": text}, optional={
        "content": st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2)),
        "is_error": st.booleans()}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": text, "signature": text}),
    st.fixed_dictionaries({"type": st.sampled_from(["image", "redacted_thinking", "server_tool_use"])}))
an_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                    "content": st.one_of(text, st.lists(an_block, max_size=3))})
anthropic_bodies = st.fixed_dictionaries({"messages": st.lists(an_message, min_size=1, max_size=5),
                                          "max_tokens": st.integers(1, 10**6)}, optional={
    "system": st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2)),
    "tools": st.lists(st.fixed_dictionaries({"name": text}, optional={"input_schema": args, "description": text}), max_size=2),
    "stream": st.booleans(), "temperature": st.floats(0, 1), "thinking": st.just({"type": "enabled", "budget_tokens": 99}),
    "context_management": args, "metadata": st.fixed_dictionaries({}, optional={"user_id": text}),
    "stop_sequences": stops, "top_p": st.floats(0, 1), "top_k": st.integers(0, 50),
    "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "none"}, {"type": "any"}, {"type": "tool", "name": "f"}])})


@pytest.fixture(scope="module")
def proxy(tiny_tokenizer):
    engine = NullEngine(tiny_tokenizer("fine", add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id])
    server, sessions, _ = serve_proxy([engine], tiny_tokenizer, max_body_bytes=4096)
    client = httpx.Client(base_url=server.base_url[:-3], timeout=30)
    yield client, sessions.mint("fuzz")
    client.close()
    server.stop()


def _check(response: httpx.Response, path: str) -> None:
    assert response.status_code < 500, (path, response.status_code, response.text)
    if response.status_code >= 400:
        body = response.json()
        if path.startswith("/v1/messages"):
            assert body["type"] == "error" and body["error"]["message"]
        else:
            assert body["error"]["message"] and body["error"]["type"]


PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(case=st.one_of(st.tuples(st.just(PATHS[0]), openai_bodies),
                      st.tuples(st.sampled_from(PATHS[1:]), anthropic_bodies)))
def test_near_valid_bodies_never_5xx(proxy, case):
    # drawn before the test runs, not with `data.draw` inside it: the previous example's proxy threads may
    # still be working then, which hypothesis cannot tell from a strategy using the `random` module
    client, key = proxy
    path, body = case
    headers = {"Authorization": f"Bearer {key}"} if path.endswith("completions") else {"x-api-key": key}
    response = client.post(path, json=body, headers=headers)
    event(f"{path} -> {response.status_code}")
    _check(response, path)
    if response.status_code == 200 and body.get("stream") and not path.endswith("count_tokens"):
        end = b"event: message_stop" if path == "/v1/messages" else b"data: [DONE]"
        assert end in response.content and b"error" not in response.content.split(end)[1], response.text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(body=bodies, path=st.sampled_from(PATHS))
def test_structured_bad_bodies_never_5xx(proxy, body, path):
    client, key = proxy
    headers = {"Authorization": f"Bearer {key}"} if path.endswith("completions") else {"x-api-key": key}
    response = client.post(path, json=body, headers=headers)
    event(f"{path} -> {response.status_code}")
    _check(response, path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.one_of(st.binary(max_size=200), json_values.map(lambda v: httpx.Request("POST", "/", json=v).content)),
       path=st.sampled_from(PATHS), key=st.sampled_from(["good", "bad", None]))
def test_raw_bytes_and_keys_never_5xx(proxy, raw, path, key):
    client, good = proxy
    headers = {} if key is None else {"x-api-key": good if key == "good" else "nope"}
    response = client.post(path, content=raw, headers=headers)
    _check(response, path)
    if key != "good":
        assert response.status_code == 401


def test_oversized_bodies_and_unknown_paths_get_api_errors(proxy):
    client, key = proxy
    big = {"messages": [{"role": "user", "content": "x" * 5000}], "max_tokens": 4}
    r = client.post("/v1/messages", json=big, headers={"x-api-key": key})
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    r = client.post("/v1/chat/completions", json=big, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 413 and "error" in r.json()
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = client.get("/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"
    r = client.post("/v1/messages?beta=true", headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
                    json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["content"][0]["text"] == "fine"
    assert client.head("/").status_code == 200
    assert client.get("/health").json()["status"] == "ok"
