"""TITO prompt building: render with the chat template, splice in exact sampled tokens.

The harness sends its whole conversation back as text on every call. Re-tokenising the
assistant turns in it would train on tokens the policy never sampled. So for every output
the proxy returns, it remembers the template's rendering of that assistant turn (the
canonical segment) and the exact output ids. When a later request contains a turn whose
rendering matches a remembered segment, the prompt carries the original ids there; the
text around it is tokenised as template text (not trainable). A turn the harness edited,
truncated or compacted matches nothing and falls back to template tokens; the builder
counts such fallbacks so the run can report them.

Requires a template that renders a conversation as a prefix of its own continuation
(every standard chat template does for whole turns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

END_OF_TURN = "<|im_end|>"


@dataclass
class Segment:
    """One recorded assistant turn: its canonical text and the ids that produced it."""

    output_ids: list[int]
    ended: bool  # True when the output ends with the end-of-turn token


@dataclass
class BuiltPrompt:
    ids: list[int]
    spliced_turns: int
    fallback_turns: int


class PromptBuilder:
    def __init__(self, tokenizer, end_of_turn: str = END_OF_TURN) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def canonical_segment(
        self, messages: list[dict[str, Any]], tools: list[dict] | None, assistant: dict[str, Any]
    ) -> str:
        """The template's rendering of `assistant` appended after `messages`."""
        before = self.render(messages, tools, generation_prompt=True)
        after = self.render(messages + [assistant], tools, generation_prompt=False)
        if not after.startswith(before):
            raise ValueError("chat template does not render a conversation as a prefix of its continuation")
        return after[len(before) :]

    def build(
        self, messages: list[dict[str, Any]], tools: list[dict] | None, segments: dict[str, Segment]
    ) -> BuiltPrompt:
        full = self.render(messages, tools, generation_prompt=True)
        ids: list[int] = []
        cursor = 0
        spliced = fallback = 0
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self.render(messages[:i], tools, generation_prompt=True)
            after = self.render(messages[: i + 1], tools, generation_prompt=False)
            if not (after.startswith(before) and full.startswith(after)):
                fallback += 1
                continue
            segment = segments.get(after[len(before) :])
            if segment is None:
                fallback += 1
                continue
            text = after[len(before) :]
            ids += self.encode(full[cursor : len(before)]) + segment.output_ids
            # What the template adds after the sampled tokens (end marker if the output was
            # cut at max tokens, then the separator) is template text.
            end = text.rfind(self.end_of_turn)
            if end < 0:
                tail = ""
            elif segment.ended:
                tail = text[end + len(self.end_of_turn) :]
            else:
                tail = text[end:]
            ids += self.encode(tail)
            cursor = len(after)
            spliced += 1
        ids += self.encode(full[cursor:])
        return BuiltPrompt(ids=ids, spliced_turns=spliced, fallback_turns=fallback)
