"""A client that disconnects from a non-streaming request, over real HTTP.

The generation is cancelled at once (the engine is told to stop), the call is recorded as
an abort with the tokens sampled so far, and it is never remembered for TITO splicing: a
partial record is not passed off as complete.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.fakes import TokenByTokenEngine, serve_proxy

LONG_REPLY = "word " * 400


def _wait_for(predicate, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.mark.parametrize("path,auth,body", [
    ("/v1/chat/completions", "Authorization: Bearer {key}", {"messages": [{"role": "user", "content": "x"}],
                                                             "max_tokens": 1000}),
    ("/v1/messages", "x-api-key: {key}", {"max_tokens": 1000, "messages": [{"role": "user", "content": "x"}]}),
])
def test_disconnect_cancels_a_non_streaming_call_and_records_an_abort(tiny_tokenizer, path, auth, body):
    engine = TokenByTokenEngine(tiny_tokenizer, LONG_REPLY, token_s=0.01)
    server, sessions, router = serve_proxy([engine], tiny_tokenizer, stop_token_ids=())
    key = sessions.mint("e")
    session = sessions.session(key)
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"{auth.format(key=key)}\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(head + payload)
            _wait_for(lambda: sum(router.load().values()) == 1)
            time.sleep(0.1)  # a few tokens in
        started = time.monotonic()
        _wait_for(lambda: len(session.calls) == 1)
        assert time.monotonic() - started < 5  # cancelled, not run to its 1000 tokens (10 s)
        assert router.load() == {engine.engine_id: 0}
    finally:
        server.stop()
    (call,) = sessions.close("e").calls
    assert call.finish_reason == "abort" and 0 < len(call.output_ids) < 1000
    (result,) = engine.results
    assert result.finish_reason == "abort" and call.output_ids == result.output_ids
    assert session.segments == {}  # never remembered for splicing
