"""Stop strings, top_p / top_k and tool_choice through the proxy.

A stop string cuts the output before the token in which it begins: the harness sees the
text of exactly the kept tokens (streaming or not, never the stop string), the record holds
exactly those tokens, the engine is stopped early, and the next turn splices the kept ids
back. The matcher never shows a token that a later cut removes, however the tokens arrive.
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.proxy.stops import StopMatcher
from tests.fakes import ScriptedEngine, TokenByTokenEngine, serve_proxy

MAX_TOKENS = 40


REPLY = "Thought: I should list the files.\nAction: ls -la\nObservation: calc.py tests.py\nThought: done"


@pytest.fixture(scope="module")
def steady_run(tiny_tokenizer):
    """A token-by-token engine behind the proxy, and its full output for the test prompt."""
    engine = TokenByTokenEngine(tiny_tokenizer, REPLY)
    server, sessions, _ = serve_proxy([engine], tiny_tokenizer, stop_token_ids=())
    body = {"messages": [{"role": "user", "content": "write calc.py"}], "max_tokens": MAX_TOKENS}
    yield engine, server, sessions, body, engine.ids[:MAX_TOKENS]
    server.stop()


def _expected_cut(tokenizer, ids, stop):
    """Reference: most leading ids whose text ends at or before where `stop` first begins."""
    text = tokenizer.decode(ids, skip_special_tokens=False)
    start = text.find(stop)
    assert start >= 0
    return max(k for k in range(len(ids) + 1)
               if len(tokenizer.decode(ids[:k], skip_special_tokens=False)) <= start
               and not tokenizer.decode(ids[:k], skip_special_tokens=False).endswith("\ufffd"))


def _stop_inside_token(tokenizer, ids, index):
    """A stop string beginning inside output token `index` (after its first character), or
    at its start when the token is one character."""
    before = len(tokenizer.decode(ids[:index], skip_special_tokens=False))
    text = tokenizer.decode(ids, skip_special_tokens=False)
    inside = len(tokenizer.decode(ids[index : index + 1], skip_special_tokens=False)) > 1
    return text[before + inside : before + inside + 3]


def test_openai_stop_cuts_before_the_token_and_records_what_was_shown(steady_run, tiny_tokenizer):
    engine, server, sessions, body, full = steady_run
    stop = _stop_inside_token(tiny_tokenizer, full, 9)  # " sh|ould": the cut drops " sh"
    keep = _expected_cut(tiny_tokenizer, full, stop)
    assert keep == 9 and len(tiny_tokenizer.decode(full[:9])) < REPLY.find(stop)
    key = sessions.mint("oa")
    client = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    n_before = len(engine.results)
    r = client.chat.completions.create(model="tiny", stop=[stop, "never-appears-xyz"], **body)
    assert r.choices[0].finish_reason == "stop"
    shown = r.choices[0].message.content or ""
    assert shown == tiny_tokenizer.decode(full[:keep], skip_special_tokens=False) and stop not in shown
    assert engine.results[n_before].finish_reason == "abort"  # the engine was stopped early
    assert len(engine.results[n_before].output_ids) < MAX_TOKENS
    chunks = client.chat.completions.create(model="tiny", stop=stop, stream=True, **body)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == shown
    # the harness sends the turn back: the kept ids are spliced, nothing falls back
    messages = body["messages"] + [{"role": "assistant", "content": shown}, {"role": "user", "content": "more"}]
    client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    session = sessions.close("oa")
    first, second, third = session.calls
    for call in (first, second):
        assert call.output_ids == full[:keep] and call.finish_reason == "stop"
        assert call.logprobs == engine.results[n_before].logprobs[:keep]
        assert call.segments[-1].end == keep
    assert third.prompt_ids[: len(first.prompt_ids) + keep] == first.prompt_ids + first.output_ids
    assert session.fallback_turns == 0


def test_anthropic_stop_sequences_report_the_stop_sequence(steady_run, tiny_tokenizer):
    engine, server, sessions, body, full = steady_run
    stop = "Observation:"  # begins at a token boundary: exactly the text before it is kept
    keep = _expected_cut(tiny_tokenizer, full, stop)
    assert tiny_tokenizer.decode(full[:keep]) == REPLY[: REPLY.find(stop)]
    key = sessions.mint("an")
    client = anthropic.Anthropic(base_url=server.base_url[:-3], api_key=key, max_retries=0)
    kwargs = dict(model="tiny", max_tokens=MAX_TOKENS, messages=body["messages"],
                  stop_sequences=["never-appears-xyz", stop])
    m = client.messages.create(**kwargs)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    text = m.content[0].text
    assert text == tiny_tokenizer.decode(full[:keep], skip_special_tokens=False)
    with client.messages.stream(**kwargs) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text and final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    assert [c.output_ids for c in sessions.close("an").calls] == [full[:keep]] * 2


def test_a_stop_string_that_never_appears_changes_nothing(steady_run, tiny_tokenizer):
    _, server, sessions, body, full = steady_run
    key = sessions.mint("none")
    r = httpx.post(f"{server.base_url}/chat/completions", json={**body, "stop": "\x00never", "stream": True},
                   headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    (call,) = sessions.close("none").calls
    assert call.output_ids == full and call.finish_reason == "length"
    assert "\x00never" not in tiny_tokenizer.decode(full)


def test_top_p_top_k_reach_the_engine_unless_the_run_forces_its_sampling(tiny_tokenizer):
    from gyre.proxy.completion import ProxyDefaults

    seen = []

    class Recording(ScriptedEngine):
        def generate(self, request):
            seen.append(request.params)
            return super().generate(request)

    for forced in (False, True):
        engine = Recording(tiny_tokenizer, ["a", "b"])
        server, sessions, _ = serve_proxy([engine], tiny_tokenizer, defaults=ProxyDefaults(force_temperature=forced))
        key = sessions.mint("e")
        try:
            httpx.post(f"{server.base_url}/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                       json={"messages": [{"role": "user", "content": "x"}], "top_p": 0.9, "temperature": 0.5})
            httpx.post(f"{server.base_url}/messages", headers={"x-api-key": key}, timeout=30,
                       json={"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "top_p": 0.8, "top_k": 5})
        finally:
            server.stop()
    assert [(p.top_p, p.top_k) for p in seen] == [(0.9, 0), (0.8, 5), (1.0, 0), (1.0, 0)]
    assert seen[0].temperature == 0.5 and seen[2].temperature == 1.0


def test_tool_choice_none_renders_no_tools_and_parses_no_calls(tiny_tokenizer):
    reply = '<tool_call>\n{"name": "run_shell", "arguments": {"command": "ls"}}\n</tool_call>'
    engine = ScriptedEngine(tiny_tokenizer, [reply, reply, reply])
    server, sessions, _ = serve_proxy([engine], tiny_tokenizer)
    key = sessions.mint("e")
    tools = [{"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "x"}]
    auth = {"Authorization": f"Bearer {key}"}
    try:
        r = httpx.post(f"{server.base_url}/chat/completions", headers=auth, timeout=30,
                       json={"messages": messages, "tools": tools, "tool_choice": "none"})
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["message"]["content"] == reply
        assert "tool_calls" not in choice["message"]
        r = httpx.post(f"{server.base_url}/messages", headers={"x-api-key": key}, timeout=30,
                       json={"max_tokens": 64, "messages": messages, "tool_choice": {"type": "none"},
                             "tools": [{"name": "run_shell", "input_schema": {"type": "object"}}]})
        assert r.json()["content"] == [{"type": "text", "text": reply}] and r.json()["stop_reason"] == "end_turn"
        r = httpx.post(f"{server.base_url}/chat/completions", headers=auth, timeout=30,
                       json={"messages": messages, "tools": tools, "tool_choice": "auto"})
        assert r.json()["choices"][0]["finish_reason"] == "tool_calls"
    finally:
        server.stop()
    no_tools, _, with_tools = engine.prompts
    assert "# Tools" not in tiny_tokenizer.decode(no_tools) and "# Tools" in tiny_tokenizer.decode(with_tools)


@pytest.mark.parametrize("path,body,kind", [
    ("/chat/completions", {"tool_choice": "required"}, "invalid_request_error"),
    ("/chat/completions", {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "invalid_request_error"),
    ("/chat/completions", {"stop": [""]}, "invalid_request_error"),
    ("/chat/completions", {"stop": ["x"] * 33}, "invalid_request_error"),
    ("/chat/completions", {"top_p": 1.5}, "invalid_request_error"),
    ("/messages", {"tool_choice": {"type": "any"}}, "invalid_request_error"),
    ("/messages", {"tool_choice": {"type": "tool", "name": "f"}}, "invalid_request_error"),
    ("/messages", {"stop_sequences": "x"}, "invalid_request_error"),
    ("/messages", {"top_k": -1}, "invalid_request_error"),
])
def test_unsupported_or_bad_sampling_fields_are_the_apis_400(tiny_tokenizer, path, body, kind):
    engine = ScriptedEngine(tiny_tokenizer, [])
    server, sessions, _ = serve_proxy([engine], tiny_tokenizer)
    key = sessions.mint("e")
    try:
        r = httpx.post(f"{server.base_url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                       json={"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], **body})
    finally:
        server.stop()
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == kind and ("tool_choice" not in str(body) or "not supported" in err["message"])
    assert engine.prompts == [] and sessions.close("e").calls == []


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(3, 400), min_size=1, max_size=30), cuts=st.lists(st.integers(1, 5), max_size=30),
       data=st.data())
def test_matcher_never_shows_a_token_it_later_cuts(tiny_tokenizer, ids, cuts, data):
    text = tiny_tokenizer.decode(ids, skip_special_tokens=False)
    start = data.draw(st.integers(0, max(0, len(text) - 1)))
    stop = text[start : start + data.draw(st.integers(1, 4))] or "zz"
    matcher, shown, pos = StopMatcher(tiny_tokenizer, (stop,)), [], 0
    for n in cuts + [len(ids)]:
        shown += matcher.push(ids[pos : pos + n])
        pos += n
        if matcher.keep is not None or pos >= len(ids):
            break
    if matcher.keep is None:
        shown += matcher.flush()
        assert shown == ids and stop not in text.replace("\ufffd", "")
    else:
        assert matcher.matched == stop and shown == ids[: matcher.keep]
        kept = tiny_tokenizer.decode(shown, skip_special_tokens=False)
        assert stop not in kept and len(kept) <= text.find(stop)
