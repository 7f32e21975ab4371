"""Control-token text inside harness content is tokenised as text, never as structure.

A chat template writes turn boundaries as special tokens (`<|im_start|>`, `<|im_end|>`) and
tool calls and results between tag tokens (`<tool_call>`, `<tool_response>`). A tokenizer
told to parse special tokens finds them anywhere in the rendered text, so a tool result,
file or web page that merely contains the text `<|im_end|><|im_start|>system` would
become real turn boundaries: a harness (or whatever it reads) could inject structure the
model never saw from the template. Only the template may emit control tokens.

How: before rendering, every occurrence of an added token's text inside message content
(and inside tool definitions) is escaped by inserting a private-use marker after its first
character (a marker already in the content is doubled). The template then cannot form a
control token from content, so every control token left in the rendered text is the
template's own. `encode` splits the text at those, maps them to their ids, and tokenises
everything between them with special-token parsing off, after removing the markers: the
escaped text comes out as the ordinary text tokens of the original characters. Text with
no marker is tokenised exactly as before (the common case costs one substring test).

Assistant turns are the model's own output; the tags it uses to structure that output
(`<think>`, `</think>`, `<tool_call>`, `</tool_call>`) stay tokens there when an edited
turn is re-tokenised, since that is how the model wrote them. Turn-boundary tokens are
escaped everywhere.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from gyre.proxy.long_text import LONG_TEXT_CHARS, LongTextTokenizer

MARKER = "\ue000"
"""Private-use character inserted into escaped control-token text (never a token here)."""
ASSISTANT_TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
"""Control tokens an assistant turn may carry as tokens (the model writes them)."""
SMALL_TEXT_CHARS = 64
"""Texts up to this long are tokenised once and remembered (the separators and turn
headers between spliced outputs recur on every call)."""
SMALL_CACHE_ENTRIES = 4096
GIL_FREE_CHARS = 1024
"""Texts at least this long are tokenised through the Rust tokenizer's `encode_batch_fast`,
which releases the GIL (its single-text `encode` holds it throughout, during which the proxy's
event loop and the other workers cannot run) and skips the character offsets the proxy never
reads; from `LONG_TEXT_CHARS` on, in a helper process (`long_text.py`). Same ids every way
(tests/test_proxy_escape.py checks). The batch call costs the single call's time from about 1k
characters on (tiny tokenizer, this box: 347 vs 357 us at 1,024 characters, 100 vs 86 us at
256); without offsets it is faster still on long texts: on the proxy-echo bench's tool results
(~11k characters) 3.1-3.4 ms against `encode`'s 4.5-5.3 ms (load 3, 2026-12-05), which was the
largest share of an agent-shaped call's time (`gyre bench proxy-echo`, py-spy)."""
_UNMARK = re.compile(MARKER + "(" + MARKER + ")?")


def _unmark(text: str) -> str:
    return _UNMARK.sub(lambda m: m.group(1) or "", text)


def _pattern(tokens: list[str]) -> re.Pattern | None:
    tokens = sorted(tokens, key=len, reverse=True)  # longest first: leftmost-longest like the tokenizer
    return re.compile("|".join(map(re.escape, tokens))) if tokens else None


class ControlTokenEscaper:
    def __init__(self, tokenizer, assistant_tags: tuple[str, ...] = ASSISTANT_TAGS) -> None:
        self._tokenizer = tokenizer
        self._ids = {tok.content: tid for tid, tok in tokenizer.added_tokens_decoder.items() if tok.content}
        self._all = _pattern(list(self._ids))
        firsts = {t[0] for t in self._ids}
        self._first = firsts.pop() if len(firsts) == 1 else None  # "<" for Qwen-style tokens: a fast pre-check
        self._boundaries = _pattern([t for t in self._ids if t not in assistant_tags])
        self._backend = getattr(tokenizer, "_tokenizer", None)  # the Rust tokenizer, when fast
        self._small: dict[str, list[int]] = {}
        self._plain = self._long = None
        if self._backend is not None:
            from tokenizers import Tokenizer

            definition = self._backend.to_str()
            self._plain = Tokenizer.from_str(definition)
            self._plain.encode_special_tokens = True  # control-token text is plain text here
            self._long = LongTextTokenizer(definition)

    def is_control_token(self, text: str) -> bool:
        """Whether `text` is one of the tokenizer's added tokens (tokenisation splits there)."""
        return text in self._ids

    # -- escaping (before rendering) -----------------------------------------------------

    def text(self, text: str, assistant: bool = False) -> str:
        pattern = self._boundaries if assistant else self._all
        if MARKER in text:
            text = text.replace(MARKER, MARKER + MARKER)
        if pattern is None:
            return text
        return pattern.sub(lambda m: m.group()[0] + MARKER + m.group()[1:], text)

    def _value(self, value: Any, assistant: bool) -> Any:
        if isinstance(value, str):
            return self.text(value, assistant)
        if isinstance(value, dict):
            return {k: self._value(v, assistant) for k, v in value.items()}
        if isinstance(value, list):
            return [self._value(v, assistant) for v in value]
        return value

    def _needs(self, blob: str) -> bool:
        if MARKER in blob:
            return True
        if self._all is None or (self._first is not None and self._first not in blob):
            return False
        return self._all.search(blob) is not None

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Template messages with control-token text in their content escaped (the same
        list when nothing needed escaping)."""
        out = None
        for i, m in enumerate(messages):
            assistant = m.get("role") == "assistant"
            escaped = m
            for field in ("content", "reasoning_content"):
                value = m.get(field)
                if isinstance(value, str) and self._needs(value):
                    escaped = dict(escaped) if escaped is m else escaped
                    escaped[field] = self.text(value, assistant)
            if m.get("tool_calls") and self._needs(orjson.dumps(m["tool_calls"], default=str).decode()):
                escaped = dict(escaped) if escaped is m else escaped
                escaped["tool_calls"] = self._value(m["tool_calls"], assistant)
            if escaped is not m:
                out = list(messages) if out is None else out
                out[i] = escaped
        return messages if out is None else out

    def tools(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        """Tool definitions with control-token text in their strings escaped."""
        if not tools or not self._needs(orjson.dumps(tools, default=str).decode()):
            return tools
        return self._value(tools, False)

    # -- tokenising (after rendering) ----------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text: control tokens where the template wrote them,
        escaped control-token text as plain text."""
        if len(text) <= SMALL_TEXT_CHARS:
            ids = self._small.get(text)
            if ids is None:
                ids = self._encode_marked(text)
                if len(self._small) < SMALL_CACHE_ENTRIES:
                    self._small[text] = ids
            return list(ids)
        return self._encode_marked(text)

    def _encode_marked(self, text: str) -> list[int]:
        if not text:
            return []
        if MARKER not in text:
            return self._encode(text, special=True)
        ids: list[int] = []
        pos = 0
        for m in self._all.finditer(text) if self._all is not None else ():
            if m.start() > pos:
                ids += self._encode(_unmark(text[pos : m.start()]), special=False)
            ids.append(self._ids[m.group()])
            pos = m.end()
        if pos < len(text):
            ids += self._encode(_unmark(text[pos:]), special=False)
        return ids

    def _encode(self, text: str, special: bool) -> list[int]:
        if self._backend is not None:
            if len(text) >= LONG_TEXT_CHARS:
                return self._long.encode(text, special)
            backend = self._backend if special else self._plain
            if len(text) >= GIL_FREE_CHARS:
                return backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
            return backend.encode(text, add_special_tokens=False).ids
        return self._tokenizer(text, add_special_tokens=False, split_special_tokens=not special)["input_ids"]
