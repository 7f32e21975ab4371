"""Validating a growing conversation once (`gyre/proxy/message_cache.py`): what a request reuses
from its execution's earlier ones, and that the result is what validating it whole gives."""

import pytest
from pydantic import TypeAdapter

from gyre.proxy.anthropic_api import MESSAGE as ANTHROPIC_MESSAGE
from gyre.proxy.message_cache import MAX_CONVERSATIONS, MessageCache, MessageError
from gyre.proxy.openai_api import MESSAGE, ChatMessage, template_message
from gyre.records import Call


def conversation(turns: int) -> list[dict]:
    out = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the bug."}]
    for k in range(turns):
        out += [{"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"call_{k}", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]},
                {"role": "tool", "tool_call_id": f"call_{k}", "content": f"result {k}\n" * 50}]
    return out


def whole(raw: list[dict]) -> list[ChatMessage]:
    return TypeAdapter(list[ChatMessage]).validate_python(raw)


def test_a_growing_conversation_validates_only_its_new_messages_and_equals_whole_validation():
    cache = MessageCache()
    derive = lambda m: template_message(m, True)  # noqa: E731
    seen = 0
    for turns in range(1, 6):
        raw = conversation(turns)
        models, templated = cache.messages("openai", raw, MESSAGE, derive)
        assert models == whole(raw)
        assert templated == [template_message(m, True) for m in whole(raw)]
        assert cache.validated - seen == (len(raw) if turns == 1 else 2)  # the new tool call and its result
        seen = cache.validated


def test_a_changed_or_removed_message_is_validated_again():
    cache = MessageCache()
    raw = conversation(3)
    cache.messages("openai", raw, MESSAGE)
    edited = [dict(m) for m in raw]
    edited[3] = {**edited[3], "content": "an edited result"}  # a compacted / edited history
    before = cache.validated
    models, _ = cache.messages("openai", edited, MESSAGE)
    assert models == whole(edited) and models[3].content == "an edited result"
    assert cache.validated - before == len(raw) - 3
    shorter = raw[:2] + raw[4:]
    models, _ = cache.messages("openai", shorter, MESSAGE)
    assert models == whole(shorter)


def test_an_invalid_new_message_is_named_by_its_index_and_leaves_the_cache_as_it_was():
    cache = MessageCache()
    raw = conversation(2)
    cache.messages("openai", raw, MESSAGE)
    bad = [*raw, {"role": "wizard", "content": "hi"}]
    with pytest.raises(MessageError, match=r"messages\.6\.role"):
        cache.messages("openai", bad, MESSAGE)
    before = cache.validated
    cache.messages("openai", [*raw, {"role": "user", "content": "go on"}], MESSAGE)
    assert cache.validated - before == 1  # the valid prefix is still remembered


def test_apis_never_share_models_and_interleaved_conversations_each_keep_their_prefix():
    cache = MessageCache()
    raw = [{"role": "user", "content": "hello"}]  # valid in both APIs
    openai_models, _ = cache.messages("openai", raw, MESSAGE)
    anthropic_models, _ = cache.messages("anthropic", raw, ANTHROPIC_MESSAGE)
    assert type(openai_models[0]) is not type(anthropic_models[0])
    main, sub = conversation(3), [{"role": "user", "content": "subagent task"}, {"role": "assistant", "content": "ok"}]
    cache.messages("openai", main, MESSAGE)
    cache.messages("openai", sub, MESSAGE)
    before = cache.validated
    cache.messages("openai", [*main, {"role": "user", "content": "next"}], MESSAGE)
    assert cache.validated - before == 1
    assert MAX_CONVERSATIONS >= 2


def test_an_assembled_call_owns_its_lists_and_keeps_the_cross_field_checks():
    ids, out = list(range(1000)), [5, 6]
    call = Call.assembled(call_id="c", execution_id="e", prompt_ids=ids, output_ids=out, logprobs=[-0.1, -0.2],
                          policy_version=0, engine_id="x", finish_reason="stop")
    ids.append(7)
    out.append(8)
    assert len(call.prompt_ids) == 1000 and call.output_ids == [5, 6]
    assert Call.model_validate_json(call.model_dump_json()) == call
    with pytest.raises(ValueError, match="2 output ids but 1 logprobs"):
        Call.assembled(call_id="c", execution_id="e", prompt_ids=[1], output_ids=[5, 6], logprobs=[-0.1],
                       policy_version=0, engine_id="x", finish_reason="stop")


def test_a_handed_over_list_is_the_records_own_not_a_copy():
    ids, out = list(range(1000)), [5, 6]
    call = Call.assembled(handed_over=("prompt_ids",), call_id="c", execution_id="e", prompt_ids=ids,
                          output_ids=out, logprobs=[-0.1, -0.2], policy_version=0, engine_id="x",
                          finish_reason="stop")
    assert call.prompt_ids is ids and call.output_ids is not out
