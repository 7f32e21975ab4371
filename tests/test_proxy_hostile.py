"""A hostile or merely unusual client, over real HTTP: each answer is a 4xx in the API's shape.

Covers what the hypothesis fuzzing (`test_proxy_fuzz.py`) cannot draw: a body that stops
arriving (slowloris), escaped lone surrogates and NaN in otherwise valid JSON, a request
carrying both auth headers, the error a client gets for a union-typed field, and a
streaming client that leaves mid-answer, on both APIs.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from gyre.benches.proxy import NullEngine
from tests.fakes import TokenByTokenEngine, serve_proxy

IDLE_S = 0.5


@pytest.fixture(scope="module")
def proxy(tiny_tokenizer):
    engine = NullEngine(tiny_tokenizer("fine", add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id])
    server, sessions, _ = serve_proxy([engine], tiny_tokenizer, body_idle_timeout_s=IDLE_S)
    client = httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30)
    yield server, client, sessions, sessions.mint("hostile")
    client.close()
    server.stop()


def _raw(port: int, data: bytes, wait_s: float) -> bytes:
    """Sends `data` and reads until the server closes or `wait_s` passes."""
    out = b""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(wait_s)
        sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except socket.timeout:
            pass
    return out


@pytest.mark.parametrize("path,framing", [
    ("/v1/chat/completions", "length"), ("/v1/messages", "length"), ("/v1/chat/completions", "chunked"),
])
def test_a_body_that_stops_arriving_gets_a_408_not_a_held_connection(proxy, path, framing):
    server, client, _, key = proxy
    body = json.dumps({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nx-api-key: {key}\r\nContent-Type: application/json\r\n"
    if framing == "length":
        data = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body[:7]
    else:
        data = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"7\r\n" + body[:7] + b"\r\n"
    started = time.monotonic()
    reply = _raw(server.port, data, wait_s=10 * IDLE_S)
    assert reply.startswith(b"HTTP/1.1 408 "), reply
    assert time.monotonic() - started < 8 * IDLE_S
    error = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    if path == "/v1/messages":
        assert error["type"] == "error" and error["error"]["type"] == "timeout_error"
        assert "after 7 bytes" in error["error"]["message"]
    else:
        assert "request body incomplete" in error["error"]["message"]
    # the proxy still serves
    r = client.post(path, json=json.loads(body), headers={"x-api-key": key})
    assert r.status_code == 200


@pytest.mark.parametrize("headers,status", [
    ({"x-api-key": "a-real-anthropic-key", "Authorization": "Bearer {key}"}, 200),
    ({"x-api-key": "{key}", "Authorization": "Bearer sk-something-else"}, 200),
    ({"x-api-key": "nope", "Authorization": "Bearer nope"}, 401),
    ({"Authorization": "Basic {key}"}, 401),
])
def test_either_auth_header_may_carry_the_key(proxy, headers, status):
    _, client, _, key = proxy
    headers = {k: v.format(key=key) for k, v in headers.items()}
    for path in ("/v1/messages", "/v1/chat/completions"):
        r = client.post(path, headers=headers, json={"max_tokens": 4, "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == status, (path, r.text)


LONE = b'"a\\ud800b"'  # an escaped lone surrogate: valid JSON, not a valid str to encode
RAW_BODIES = {
    "lone surrogate in content": b'{"max_tokens":4,"messages":[{"role":"user","content":' + LONE + b"}]}",
    "lone surrogate in tool-call arguments": (  # survives JSON parsing, fails in the template
        b'{"max_tokens":4,"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"a",'
        b'"function":{"name":"f","arguments":"{\\"a\\":\\"\\\\ud800\\"}"}}]},{"role":"tool","tool_call_id":"a",'
        b'"content":"r"}]}'),
    "NaN temperature": b'{"max_tokens":4,"temperature":NaN,"messages":[{"role":"user","content":"x"}]}',
    "infinite max_tokens": b'{"max_tokens":1e999,"messages":[{"role":"user","content":"x"}]}',
    "nested 100k deep": b'{"messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "invalid UTF-8": b'{"max_tokens":4,"messages":[{"role":"user","content":"\xff\xfe"}]}',
    "a JSON array": b"[1, 2]",
}


@pytest.mark.parametrize("name", RAW_BODIES)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"])
def test_unencodable_or_non_standard_json_is_a_400(proxy, name, path):
    _, client, sessions, key = proxy
    calls = len(sessions.session(key).calls)
    r = client.post(path, content=RAW_BODIES[name], headers={"x-api-key": key, "content-type": "application/json"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message and "internal" not in message
    assert len(sessions.session(key).calls) == calls  # nothing recorded, nothing lost


@pytest.mark.parametrize("path,body,message", [
    ("/v1/chat/completions", {"stop": [f"s{i}" for i in range(100)]},
     "invalid request: stop: List should have at most 32 items after validation, not 100"),
    ("/v1/chat/completions", {"tool_choice": {"type": "function"}},
     "invalid request: tool_choice.ToolChoiceFunction.function: Field required"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
     "invalid request: messages.0.content.0.text: Input should be a valid string"),
    ("/v1/messages", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": [1]}]}]},
     "invalid request: messages.1.content.0.tool_use.input: Input should be a valid dictionary"),
])
def test_a_union_field_error_names_the_branch_that_fits(proxy, path, body, message):
    """Not pydantic's first union branch ('stop: should be a valid string' for a list of 100)."""
    _, client, _, key = proxy
    r = client.post(path, headers={"x-api-key": key},
                    json={"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], **body})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == message


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
def test_a_streaming_client_that_leaves_stops_the_engine_and_the_call_is_recorded_as_an_abort(tiny_tokenizer, path):
    """Both APIs (the torch-engine test in `test_proxy_drain.py` covers only OpenAI's)."""
    engine = TokenByTokenEngine(tiny_tokenizer, "word " * 400, token_s=0.01)
    server, sessions, router = serve_proxy([engine], tiny_tokenizer, stop_token_ids=())
    key = sessions.mint("e")
    try:
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1000, "stream": True}
        with httpx.stream("POST", f"http://127.0.0.1:{server.port}{path}", headers={"x-api-key": key}, json=body,
                          timeout=30) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            while "wor" not in next(lines):  # a token has been streamed
                pass
        session = sessions.session(key)
        deadline = time.monotonic() + 5  # cancelled, not run to its 1000 tokens (10 s)
        while not session.calls:
            assert time.monotonic() < deadline, "the abort was not recorded"
            time.sleep(0.01)
        assert router.load() == {engine.engine_id: 0}
    finally:
        server.stop()
    (call,) = sessions.close("e").calls
    (result,) = engine.results
    assert call.finish_reason == result.finish_reason == "abort"
    assert 0 < len(call.output_ids) < 1000 and call.output_ids == result.output_ids
