"""Cheap bounds checked before a request's heavy work, so a huge request is refused at once.

Templating and tokenising cost time linear in the prompt (8 MB of text takes the bundled
tokenizer tens of seconds), so a request that can never be served must be refused before
either runs. Two checks do that, each O(size) at C speed:

- the body's size: `max_body_bytes` (a config field), checked against `Content-Length`
  and again while the body arrives (`app.py`): 413, `request_too_large` for Anthropic;
- the prompt's characters, by `PromptLimit`: every chat template renders the content of
  system, user and tool messages verbatim (assistant turns may be rewritten: Qwen3 drops
  old reasoning, so they are not counted), and one token of the vocabulary stands for at
  most `L` characters, its longest entry's length (byte-level BPE writes one character per
  byte, so a token's entry is at least as long as the text it stands for; escaped
  control-token text is tokenised as plain text, `escape.py`). A tokenizer with a
  normalizer may first compose up to `MAX_COMPOSED_CHARS` characters into one (NFC, NFKC),
  so `L` is multiplied by that. A prompt whose counted characters exceed
  `context_tokens * L` therefore needs more tokens than the model's context holds,
  whatever the template adds: 400 `context_length` (OpenAI's `context_length_exceeded`),
  the message naming both numbers. Under the bound the request goes on, and the engine's
  exact token count still decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gyre.proxy.errors import ProxyError

MAX_COMPOSED_CHARS = 4
"""Most characters a Unicode normalizer composes into one (the longest canonical
decomposition is 4 code points, e.g. U+1F82)."""


def counted_chars(messages: list[dict[str, Any]]) -> int:
    """Characters of the message content every template renders verbatim (not assistant turns)."""
    return sum(
        len(m["content"]) for m in messages if m.get("role") != "assistant" and isinstance(m.get("content"), str)
    )


@dataclass(frozen=True)
class PromptLimit:
    context_tokens: int
    """The model's context, in tokens."""
    max_token_chars: int
    """Most characters one token can stand for (see the module docstring)."""

    @classmethod
    def for_tokenizer(cls, tokenizer, context_tokens: int) -> "PromptLimit":
        longest = max(len(entry) for entry in tokenizer.get_vocab())
        backend = getattr(tokenizer, "_tokenizer", None)
        normalizes = backend is None or backend.normalizer is not None
        return cls(context_tokens, longest * (MAX_COMPOSED_CHARS if normalizes else 1))

    @property
    def max_chars(self) -> int:
        return self.context_tokens * self.max_token_chars

    def check(self, messages: list[dict[str, Any]]) -> int:
        """The prompt's counted characters; a 400 when they cannot fit the context."""
        chars = counted_chars(messages)
        if chars > self.max_chars:
            raise ProxyError(
                400,
                f"prompt too long: its system, user and tool messages hold {chars} characters, more than the "
                f"model's context of {self.context_tokens} tokens can hold ({self.max_chars} characters at "
                f"{self.max_token_chars} characters per token at most)",
                "context_length",
                param="messages",
            )
        return chars
