"""TITO prompt building and output streaming, without HTTP.

The prefix-state cache must never change a prompt: building with the cache equals
building from scratch. A changed turn is a counted fallback with its template tokens'
positions reported. Streamed deltas always add up to exactly the final parse, whatever
bytes the model samples.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.proxy.output import IncrementalDecoder, OutputStreamer, parse_output
from gyre.proxy.prompt import PromptBuilder, TitoCache
from gyre.proxy.toolcalls import QwenToolCallParser

TOOLS = [{"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object"}}}]


def _agent_loop(tokenizer, turns: int, seed: int = 0):
    """Yield (messages, cache-built prompt, scratch-built prompt) along a fake agent loop."""
    rng = random.Random(seed)
    builder, cache = PromptBuilder(tokenizer), TitoCache()
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    vocab = len(tokenizer)
    for turn in range(turns):
        prompt = builder.build(messages, TOOLS, cache)
        scratch = builder.build(messages, TOOLS, TitoCache(segments=dict(cache.segments)))
        yield messages, prompt, scratch
        output = [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 12))]
        ended = turn % 3 != 2
        if ended:
            output.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        text = tokenizer.decode(output[:-1] if ended else output, skip_special_tokens=False)
        parsed = parse_output(text, QwenToolCallParser())
        assistant = {"role": "assistant", "content": parsed.content}
        builder.remember(cache, prompt, assistant, output, ended)
        messages = messages + [assistant, {"role": "tool", "content": f"out {turn}", "tool_call_id": "t"}]


def test_prefix_cache_gives_the_same_prompt_as_building_from_scratch(tiny_tokenizer):
    previous = None
    for _, prompt, scratch in _agent_loop(tiny_tokenizer, 12):
        assert prompt.ids == scratch.ids
        assert prompt.fallback_turns == 0 and scratch.fallback_turns == 0
        if previous is not None:
            assert prompt.ids[: len(previous.ids)] == previous.ids
        previous = prompt


def test_an_edited_turn_is_a_counted_fallback_with_its_span(tiny_tokenizer):
    builder, cache = PromptBuilder(tiny_tokenizer), TitoCache()
    messages = [{"role": "user", "content": "hi"}]
    prompt = builder.build(messages, None, cache)
    output = tiny_tokenizer("sampled answer", add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
    builder.remember(cache, prompt, {"role": "assistant", "content": "sampled answer"}, output, True)
    kept = builder.build(messages + [{"role": "assistant", "content": "sampled answer"},
                                     {"role": "user", "content": "more"}], None, cache)
    assert kept.ids[len(prompt.ids): len(prompt.ids) + len(output)] == output and kept.fallback_turns == 0
    edited = builder.build(messages + [{"role": "assistant", "content": "an edited answer"},
                                       {"role": "user", "content": "more"}], None, cache)
    assert edited.fallback_turns == 1
    ((start, end),) = edited.fallback_spans
    assert "edited" in tiny_tokenizer.decode(edited.ids[start:end])
    assert edited.ids[:start] == prompt.ids


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), pieces=st.lists(st.sampled_from(
    ["<think>", "</think>", "<tool_call>", "</tool_call>", '{"name": "f", "arguments": {"a": 1}}', "  ", "\n",
     "hello", "é", "<", "<tool", "think>", "x"]), max_size=10))
def test_streamed_deltas_add_up_to_the_final_parse(tiny_tokenizer, seed, pieces):
    rng = random.Random(seed)
    text_ids = tiny_tokenizer("".join(pieces), add_special_tokens=False)["input_ids"]
    text_ids += [rng.randrange(3, len(tiny_tokenizer)) for _ in range(rng.randrange(0, 6))]
    decoder, streamer = IncrementalDecoder(tiny_tokenizer), OutputStreamer(QwenToolCallParser())
    got = {"reasoning": "", "content": ""}
    i = 0
    while i < len(text_ids):
        n = rng.randrange(1, 4)
        for kind, delta in streamer.push(decoder.push(text_ids[i: i + n])):
            got[kind] += delta
        i += n
    final = parse_output(decoder.text(), QwenToolCallParser())
    for kind, delta in streamer.finish(final):
        got[kind] += delta
    assert got == {"reasoning": final.reasoning or "", "content": final.content}
    assert decoder.text() == tiny_tokenizer.decode(text_ids, skip_special_tokens=False)


def test_reasoning_and_tool_calls_parse_out_of_the_text():
    parsed = parse_output('<think>plan</think>\n\nok\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
                          QwenToolCallParser())
    assert parsed.reasoning == "plan" and parsed.content == "ok"
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("f", {"x": 1})]


def test_a_deferred_remember_is_settled_by_the_next_build_once_and_a_failing_one_only_unsplices(tiny_tokenizer):
    """The proxy answers before it remembers the turn (`TitoCache.defer`); the next build of the
    execution settles what is pending first, so it splices the turn exactly as if remembered at
    once, and a background settle that comes later finds nothing left to run."""
    builder, cache = PromptBuilder(tiny_tokenizer), TitoCache()
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    first = builder.build(messages, TOOLS, cache)
    output = [tiny_tokenizer.convert_tokens_to_ids(t) for t in ("a", "b")]
    output.append(tiny_tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assistant = {"role": "assistant", "content": tiny_tokenizer.decode(output[:-1])}
    runs = []
    cache.defer(lambda: (runs.append(1), builder.remember(cache, first, assistant, output, True)))
    cache.defer(lambda: (_ for _ in ()).throw(ValueError("a template that rewrites history")))
    second = builder.build([*messages, assistant, {"role": "user", "content": "more"}], TOOLS, cache)
    assert runs == [1] and second.fallback_turns == 0  # resumed from the state the remember left
    assert second.ids[: len(first.ids) + len(output)] == first.ids + output
    cache.settle()  # the worker's settle after the answer: nothing left, nothing run twice
    assert runs == [1]


def test_tool_calling_turns_with_long_results_build_as_from_scratch(tiny_tokenizer):
    """The incremental path (prefix state + the new messages' text, long tool results tokenised
    by the GIL-free call) gives the ids of a build from scratch, turn after turn, when the model
    calls tools and the harness sends each call back as the proxy returned it."""
    from gyre.proxy.escape import GIL_FREE_CHARS

    builder, cache = PromptBuilder(tiny_tokenizer), TitoCache()
    rng = random.Random(3)
    end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix the tests"}]
    previous = None
    for turn in range(6):
        prompt = builder.build(messages, TOOLS, cache)
        scratch = builder.build(messages, TOOLS, TitoCache(segments=dict(cache.segments)))
        assert prompt.ids == scratch.ids and prompt.fallback_turns == 0
        assert scratch.spliced_turns == turn and scratch.fallback_turns == 0  # every earlier call spliced
        if previous is not None:
            assert prompt.ids[: len(previous.ids)] == previous.ids
        previous = prompt
        command = f"pytest -q tests/test_{turn}.py"
        text = f'Running.\n<tool_call>\n{{"name": "run_shell", "arguments": {{"cmd": "{command}"}}}}\n</tool_call>'
        output = tiny_tokenizer(text, add_special_tokens=False)["input_ids"] + [end]
        parsed = parse_output(text, QwenToolCallParser())
        assert [c.name for c in parsed.tool_calls] == ["run_shell"]
        assistant = {"role": "assistant", "content": parsed.content, "tool_calls": [
            {"id": f"call_{turn}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.tool_calls]}
        builder.remember(cache, prompt, assistant, output, True)
        result = "".join(rng.choice("abc def\n=_.()") for _ in range(GIL_FREE_CHARS * 3))
        messages = messages + [assistant, {"role": "tool", "content": result, "tool_call_id": f"call_{turn}"}]


def test_the_next_prompts_ids_are_made_when_the_turn_is_remembered_and_taken_once(tiny_tokenizer):
    """Remembering a turn (after the answer, off the call's path) makes the next prompt's list of the
    context's ids ahead; the execution's next build takes that list and extends it. A second build from
    the same state (a harness retrying the call) gets its own copy, so neither prompt changes the other
    or the state; a newer state's remember drops the older state's unused list."""
    builder, cache = PromptBuilder(tiny_tokenizer), TitoCache()
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    first = builder.build(messages, TOOLS, cache)
    output = [tiny_tokenizer.convert_tokens_to_ids(t) for t in ("a", "b")] + [
        tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assistant = {"role": "assistant", "content": tiny_tokenizer.decode(output[:-1])}
    builder.remember(cache, first, assistant, output, True)
    (state,) = cache.states.values()
    ready = state.ready
    assert ready == state.head_ids + state.tail_ids and ready is not first.ids
    conversation = [*messages, assistant, {"role": "user", "content": "more"}]
    second = builder.build(conversation, TOOLS, cache)
    retry = builder.build(conversation, TOOLS, cache)
    assert second.ids is ready and state.ready is None  # taken, then extended with the new text
    assert retry.ids == second.ids and retry.ids is not second.ids
    parts = state.head_ids + state.tail_ids
    assert state.head_ids is first.ids and second.ids[: len(parts)] == parts
    assert len(second.ids) > len(state.head_ids) + len(state.tail_ids)
    third_state_prompt = builder.build([*messages, assistant, {"role": "user", "content": "other"}], TOOLS, cache)
    builder.remember(cache, third_state_prompt, assistant, output, True)
    assert [s.ready is None for s in cache.states.values()] == [True, False]  # only the newest keeps one
