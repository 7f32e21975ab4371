"""From sampled tokens to what a harness reads: reasoning, content, tool calls.

Both APIs, streaming or not, present one output the same way, defined by `parse_output`
on the decoded text:

- reasoning: when the text starts with `<think>`, the text up to `</think>` (to the end
  if the model never closed it); the rest, leading whitespace removed, goes on;
- content and tool calls: the model family's tool-call parser on the rest.

`OutputStreamer` sends that presentation incrementally: it decodes tokens as they arrive
(holding back bytes that do not yet form a whole character), sends reasoning and content
deltas as soon as they cannot change, holds back text from where a tool call may begin,
and at the end sends whatever the final parse adds. What a streaming client assembles is
therefore exactly what the non-streaming response says, which is what TITO matching of
the turn, when the harness sends it back, depends on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gyre.proxy.toolcalls import ToolCall, ToolCallParser

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass
class ParsedOutput:
    reasoning: str | None
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


def parse_output(text: str, parser: ToolCallParser) -> ParsedOutput:
    reasoning = None
    if text.startswith(THINK_OPEN):
        end = text.find(THINK_CLOSE)
        if end < 0:
            reasoning, text = text[len(THINK_OPEN) :], ""
        else:
            reasoning, text = text[len(THINK_OPEN) : end], text[end + len(THINK_CLOSE) :].lstrip()
    content, calls = parser.parse(text)
    return ParsedOutput(reasoning, content, calls)


class IncrementalDecoder:
    """Token ids -> text deltas whose concatenation is the decoded text (vLLM's method:
    decode a short window and hold back a trailing incomplete character)."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def push(self, ids: list[int]) -> str:
        self.ids += ids
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        text = self._decode(self.ids[self._prefix_offset :])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
            return text[len(prefix) :]
        return ""

    def text(self) -> str:
        return self._decode(self.ids)


def _held_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class OutputStreamer:
    """Text deltas in, ("reasoning" | "content", delta) events out; `finish` adds the rest."""

    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser
        self._buffer = ""  # decoded text not yet classified
        self._mode = "start"  # start -> think -> after_think -> content -> held
        self.sent_reasoning = ""
        self.sent_content = ""

    def push(self, delta: str) -> list[tuple[str, str]]:
        self._buffer += delta
        events: list[tuple[str, str]] = []
        if self._mode == "start":
            if len(self._buffer) < len(THINK_OPEN) and THINK_OPEN.startswith(self._buffer):
                return events  # might still become <think>
            if self._buffer.startswith(THINK_OPEN):
                self._buffer, self._mode = self._buffer[len(THINK_OPEN) :], "think"
            else:
                self._mode = "content"
        if self._mode == "think":
            end = self._buffer.find(THINK_CLOSE)
            if end < 0:
                keep = _held_suffix(self._buffer, THINK_CLOSE)
                self._send(events, "reasoning", self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                return events
            self._send(events, "reasoning", self._buffer[:end])
            self._buffer, self._mode = self._buffer[end + len(THINK_CLOSE) :], "after_think"
        if self._mode == "after_think":
            self._buffer = self._buffer.lstrip()
            if not self._buffer:
                return events
            self._mode = "content"
        if self._mode == "content":
            tag = self._parser.open_tag
            at = self._buffer.find(tag) if tag is not None else -1
            if at >= 0:
                self._send(events, "content", self._buffer[:at].rstrip())
                self._buffer, self._mode = self._buffer[len(self._buffer[:at].rstrip()) :], "held"
                return events
            stripped = self._buffer.rstrip()
            safe = stripped[: len(stripped) - _held_suffix(stripped, tag)] if tag is not None else stripped
            self._send(events, "content", safe)
            self._buffer = self._buffer[len(safe) :]
        return events

    def finish(self, final: ParsedOutput) -> list[tuple[str, str]]:
        """Events that complete the stream so it says exactly `final`."""
        reasoning = final.reasoning or ""
        if not (reasoning.startswith(self.sent_reasoning) and final.content.startswith(self.sent_content)):
            raise RuntimeError("streamed output diverged from its final parse")
        events: list[tuple[str, str]] = []
        self._send(events, "reasoning", reasoning[len(self.sent_reasoning) :])
        self._send(events, "content", final.content[len(self.sent_content) :])
        return events

    def _send(self, events: list[tuple[str, str]], kind: str, text: str) -> None:
        if not text:
            return
        if kind == "reasoning":
            self.sent_reasoning += text
        else:
            self.sent_content += text
        events.append((kind, text))
