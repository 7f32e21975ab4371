"""The official `openai` and `anthropic` SDKs against the real proxy over HTTP.

In front of the real tiny model: across a 10-turn tool-offering conversation, streaming
and not, every recorded call's output ids and log-probs are exactly what the engine
sampled, each prompt extends the previous prompt + output (TITO), and what the SDK shows
is the decoded output. With a scripted model that calls tools every turn: tool calls and
tool results round-trip through each SDK and the sampled ids are spliced back every time.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from gyre.engines.torch.rollout import TorchRolloutEngine
from tests.fakes import ScriptedEngine, SpyEngine, serve_proxy

TOOLS_OPENAI = [{"type": "function", "function": {
    "name": "run_shell", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
TOOLS_ANTHROPIC = [{"name": "run_shell", "description": "Run a shell command",
                    "input_schema": TOOLS_OPENAI[0]["function"]["parameters"]}]
TURNS = 10


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    engine = TorchRolloutEngine(tiny_model_dir, engine_id="torch-sdk", seed=11)
    yield engine
    engine.close()


def _assert_exact(calls, spy, tokenizer):
    assert len(calls) == len(spy.results) == TURNS
    for call, result, request in zip(calls, spy.results, spy.requests):
        assert call.output_ids == result.output_ids and call.logprobs == result.logprobs
        assert call.prompt_ids == request.prompt_ids
        assert call.segments[0].engine_id == spy.engine_id and call.finish_reason in ("stop", "length")
    for earlier, later in zip(calls, calls[1:]):
        n = len(earlier.prompt_ids) + len(earlier.output_ids)
        assert later.prompt_ids[:n] == earlier.prompt_ids + earlier.output_ids


def _text(call, tokenizer):
    ids = call.output_ids[:-1] if call.finish_reason == "stop" else call.output_ids
    return tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.slow
def test_openai_sdk_ten_turns_record_exact_sampled_tokens(tiny_engine, tiny_tokenizer):
    spy = SpyEngine(tiny_engine)
    server, sessions, _ = serve_proxy([spy], tiny_tokenizer)
    client = openai.OpenAI(base_url=server.base_url, api_key=sessions.mint("exec-oa"), max_retries=0)
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "make calc.py"}]
    seen = []
    try:
        for turn in range(TURNS):
            kwargs = dict(model="tiny", messages=messages, tools=TOOLS_OPENAI, max_tokens=8, temperature=1.0)
            if turn % 2:
                content, calls = "", {}
                for chunk in client.chat.completions.create(stream=True, **kwargs):
                    delta = chunk.choices[0].delta
                    content += delta.content or ""
                    for tc in delta.tool_calls or []:
                        calls[tc.index] = tc
                message = {"role": "assistant", "content": content or None}
            else:
                message = client.chat.completions.create(**kwargs).choices[0].message.model_dump(exclude_none=True)
                content = message.get("content") or ""
            seen.append(content)
            messages += [message, {"role": "tool" if message.get("tool_calls") else "user",
                                   "content": f"exit code {turn}", **({"tool_call_id": "x"} if message.get("tool_calls") else {})}]
    finally:
        server.stop()
    session = sessions.close("exec-oa")
    _assert_exact(session.calls, spy, tiny_tokenizer)
    assert session.fallback_turns == 0
    for call, content in zip(session.calls, seen):
        assert content == _text(call, tiny_tokenizer)  # the random model never forms a tool call


@pytest.mark.slow
def test_anthropic_sdk_ten_turns_record_exact_sampled_tokens(tiny_engine, tiny_tokenizer):
    spy = SpyEngine(tiny_engine)
    server, sessions, _ = serve_proxy([spy], tiny_tokenizer)
    client = anthropic.Anthropic(base_url=server.base_url[: -len("/v1")], api_key=sessions.mint("exec-an"), max_retries=0)
    messages = [{"role": "user", "content": [{"type": "text", "text": "make calc.py"}]}]
    system = [{"type": "text", "text": "You are Claude Code."}, {"type": "text", "text": "Be brief."}]
    seen = []
    try:
        for turn in range(TURNS):
            kwargs = dict(model="tiny", system=system, messages=messages, tools=TOOLS_ANTHROPIC, max_tokens=8,
                          extra_query={"beta": "true"}, extra_headers={"anthropic-beta": "claude-code-20250219"})
            if turn % 2:
                with client.messages.stream(**kwargs) as stream:
                    message = stream.get_final_message()
            else:
                message = client.messages.create(**kwargs)
            text = "".join(b.text for b in message.content if b.type == "text")
            seen.append(text)
            messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
                         {"role": "user", "content": f"go on {turn}"}]
    finally:
        server.stop()
    session = sessions.close("exec-an")
    _assert_exact(session.calls, spy, tiny_tokenizer)
    assert session.fallback_turns == 0
    for call, text in zip(session.calls, seen):
        assert text == _text(call, tiny_tokenizer)


def _tool_call_replies(tokenizer, n):
    return [f'<tool_call>\n{{"name": "run_shell", "arguments": {{"command": "ls  -la {i}"}}}}\n</tool_call>'
            if i < n - 1 else "all done" for i in range(n)]


def test_openai_sdk_tool_calls_round_trip_and_splice(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, _tool_call_replies(tiny_tokenizer, TURNS))
    server, sessions, _ = serve_proxy([engine], tiny_tokenizer)
    client = openai.OpenAI(base_url=server.base_url, api_key=sessions.mint("e"), max_retries=0)
    messages = [{"role": "user", "content": "list files"}]
    try:
        for turn in range(TURNS):
            if turn % 2:
                calls, content = {}, ""
                for chunk in client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS_OPENAI, stream=True):
                    if chunk.choices and chunk.choices[0].delta.tool_calls:
                        for tc in chunk.choices[0].delta.tool_calls:
                            calls[tc.index] = {"id": tc.id, "type": "function",
                                               "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
                    if chunk.choices:
                        content += chunk.choices[0].delta.content or ""
                message = {"role": "assistant", "content": content or None, "tool_calls": list(calls.values()) or None}
                message = {k: v for k, v in message.items() if v is not None}
            else:
                choice = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS_OPENAI).choices[0]
                message = choice.message.model_dump(exclude_none=True)
            messages.append(message)
            for tc in message.get("tool_calls", []):
                assert tc["function"]["name"] == "run_shell" and "ls  -la" in tc["function"]["arguments"]
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": f"file{turn}.py"})
            if not message.get("tool_calls"):
                assert message["content"] == "all done"
                messages.append({"role": "user", "content": "thanks"})
    finally:
        server.stop()
    session = sessions.close("e")
    assert len(session.calls) == TURNS and session.fallback_turns == 0
    for k, later in enumerate(session.calls[1:], start=1):
        earlier = session.calls[k - 1]
        assert later.prompt_ids[: len(earlier.prompt_ids) + len(earlier.output_ids)] == earlier.prompt_ids + earlier.output_ids


def test_anthropic_sdk_tool_use_round_trip_and_splice(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, _tool_call_replies(tiny_tokenizer, TURNS))
    server, sessions, _ = serve_proxy([engine], tiny_tokenizer)
    client = anthropic.Anthropic(base_url=server.base_url[: -len("/v1")], api_key=sessions.mint("e"), max_retries=0)
    messages = [{"role": "user", "content": "list files"}]
    try:
        for turn in range(TURNS):
            kwargs = dict(model="tiny", max_tokens=64, messages=messages, tools=TOOLS_ANTHROPIC,
                          system="sys", thinking={"type": "enabled", "budget_tokens": 1024})
            if turn % 2:
                with client.messages.stream(**kwargs) as stream:
                    message = stream.get_final_message()
            else:
                message = client.messages.create(**kwargs)
            blocks = [b.model_dump(exclude_none=True) for b in message.content]
            messages.append({"role": "assistant", "content": blocks})
            uses = [b for b in message.content if b.type == "tool_use"]
            if uses:
                assert message.stop_reason == "tool_use" and uses[0].input == {"command": f"ls  -la {turn}"}
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": u.id, "content": [{"type": "text", "text": "ok"}]} for u in uses]})
            else:
                assert message.stop_reason == "end_turn" and message.content[0].text == "all done"
                messages.append({"role": "system", "content": "a mid-conversation system note"})
                messages.append({"role": "user", "content": "thanks"})
    finally:
        server.stop()
    session = sessions.close("e")
    assert len(session.calls) == TURNS and session.fallback_turns == 0
    for earlier, later in zip(session.calls, session.calls[1:]):
        assert later.prompt_ids[: len(earlier.prompt_ids) + len(earlier.output_ids)] == earlier.prompt_ids + earlier.output_ids
