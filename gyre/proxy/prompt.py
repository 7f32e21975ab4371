"""TITO prompt building: render with the chat template, splice in exact sampled tokens.

The harness sends its whole conversation back as text on every call. Re-tokenising the
assistant turns in it would train on tokens the policy never sampled. So for every output
the proxy returns, it remembers the template's rendering of that assistant turn in its
context (the canonical text) and the exact output ids. When a later request contains a
turn whose rendering matches a remembered one, the prompt carries the original ids there;
the text around it is tokenised as template text (not trainable). A turn the harness
edited, truncated or compacted matches nothing and falls back to template tokens; the
builder counts such fallbacks and reports their prompt positions so they are never
mistaken for policy tokens.

Cost. An agent loop sends a conversation that is the previous one plus the returned turn
plus new tool results, hundreds of times. Re-tokenising (or re-rendering every prefix of)
the whole history each turn is quadratic, so each execution keeps a few *prefix states*:
the rendered text of a conversation that ended with a returned turn, and its prompt ids
with the sampled ids spliced in. A request starts from the longest state whose text
prefixes its own rendering; only the rest is examined and tokenised. A turn-by-turn agent
therefore costs one template render plus tokenising the new messages per call. A
conversation's first turn (the system prompt and tool definitions, the same for every
execution of a run and often most of a first prompt) is tokenised once per process
(`MAX_CACHED_HEADS`): text ending in a control token splits there without changing its
tokens, so the cached ids are exact.

Control-token text inside content (a tool result holding `<|im_end|>`) is escaped before
rendering and tokenised as plain text (`escape.py`), so only the template writes structure.

Requires a template that renders a conversation as a prefix of its own continuation
(every standard chat template does for whole turns). A template that rewrites earlier
turns (Qwen3 drops old reasoning) breaks that prefix and shows up as fallbacks.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gyre.proxy.escape import ControlTokenEscaper

log = logging.getLogger(__name__)

END_OF_TURN = "<|im_end|>"
MAX_CACHED_HEADS = 64
"""First turns (system prompt + tools) whose token ids are kept, across executions."""
MAX_PREFIX_STATES = 4
"""Prefix states kept per execution (most recently used first out of the cache last)."""


@dataclass
class Segment:
    """One recorded assistant turn: the ids that produced it."""

    output_ids: list[int]
    ended: bool  # True when the output ends with the end-of-turn token


@dataclass
class PrefixState:
    """Rendered text of a conversation ending with a returned turn, and its prompt ids: the ids of
    the prompt that produced the turn (shared with that call's record, never changed) followed by
    `tail_ids` (the sampled ids and what the template adds after them).

    A build starts its own prompt's list from these ids and extends it. Remembering the turn,
    which runs after the answer (off the call's path), makes that list ahead (`ready`), so the
    execution's next call does not copy its whole context on its path (~0.15 ms at 50k tokens,
    milliseconds at a million); the first build from the state takes it (`TitoCache.take_ids`),
    any other copies the two parts. Only an execution's newest state keeps a `ready` list."""

    text: str
    head_ids: list[int]
    tail_ids: list[int]
    num_messages: int
    fallback_spans: list[tuple[int, int]]
    ready: list[int] | None = None
    """`head_ids + tail_ids`, made when remembered, until a build takes it (then None)."""


@dataclass
class TitoCache:
    """One execution's splice memory: canonical turn text -> segment, and prefix states.

    Remembering a returned turn is deferred (`defer`): the proxy answers first and remembers
    after, off the call's path; a later build of the same execution settles (runs) whatever is
    still pending before it looks, so it never misses a turn."""

    segments: dict[str, Segment] = field(default_factory=dict)
    states: OrderedDict[int, PrefixState] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _pending: list[Callable[[], None]] = field(default_factory=list)
    _settling: threading.Lock = field(default_factory=threading.Lock)

    def defer(self, remember: Callable[[], None]) -> None:
        """`remember()` is run by `settle`: by whoever calls it first (a worker after the answer,
        or the next build), exactly once."""
        with self.lock:
            self._pending.append(remember)

    def remembered(self) -> bool:
        """Whether a returned turn is remembered, or waits to be (a later prompt reuses its prefix)."""
        with self.lock:
            return bool(self.states or self._pending)

    def settle(self) -> None:
        """Run every deferred remember, in the order deferred. One that fails (a chat template that
        does not render a conversation as a prefix of its continuation) is logged: its turn is not
        remembered, so a later prompt holding it falls back to template tokens (counted as such)."""
        with self._settling:
            while True:
                with self.lock:
                    if not self._pending:
                        return
                    remember = self._pending.pop(0)
                try:
                    remember()
                except ValueError:  # deliberate: the turn stays unspliced, its tokens marked as fallback
                    log.exception("proxy: a returned turn could not be remembered for splicing")

    def best_state(self, full: str, num_messages: int) -> PrefixState | None:
        self.settle()
        with self.lock:
            best = None
            for key, state in self.states.items():
                if (
                    state.num_messages <= num_messages
                    and (best is None or len(state.text) > len(best.text))
                    and full.startswith(state.text)
                ):
                    best, best_key = state, key
            if best is not None:
                self.states.move_to_end(best_key)
            return best

    def take_ids(self, state: PrefixState) -> list[int]:
        """A new list of `state`'s ids for a build to extend: its `ready` list the first time."""
        with self.lock:
            ready, state.ready = state.ready, None
        return ready if ready is not None else state.head_ids + state.tail_ids

    def remember(self, canonical: str, segment: Segment, state: PrefixState | None) -> None:
        with self.lock:
            self.segments[canonical] = segment
            if state is not None:
                for older in self.states.values():  # one list made ahead per execution: the newest state's
                    older.ready = None
                self.states[id(state)] = state
                while len(self.states) > MAX_PREFIX_STATES:
                    self.states.popitem(last=False)


@dataclass
class BuiltPrompt:
    ids: list[int]
    text: str  # the template rendering (with generation prompt) the ids stand for
    num_messages: int
    messages: list[dict[str, Any]] = field(default_factory=list)  # as rendered (escaped)
    tools: list[dict] | None = None  # as rendered (escaped)
    spliced_turns: int = 0
    fallback_turns: int = 0
    fallback_spans: list[tuple[int, int]] = field(default_factory=list)
    base: PrefixState | None = field(default=None, repr=False)
    """The prefix state the build started from (its ids begin with the state's), if any."""
    handle: int | None = None
    """Its number in a build worker (`build_processes.py`), which keeps it for the turn's remember."""


def _compiled_template(tokenizer):
    """transformers' compiled (sandboxed, cached) jinja template, or None if unavailable.

    Rendering it directly skips `apply_chat_template`'s deep copy of every message, which
    for a long conversation costs more than the render itself. Messages given to it must
    be plain dicts without None values (what the API front ends produce).
    """
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return None
    return _compile_jinja_template(tokenizer.chat_template)


_REASONING_ALIASES = ("thinking", "reasoning")


END_OF_TURN_TOKENS = (END_OF_TURN, "<|eot_id|>")
"""The token that closes a turn, per family: ChatML's (Qwen, SmolLM2, the tiny model) and Llama 3's."""


def end_of_turn_for(tokenizer) -> str:
    """The first of `END_OF_TURN_TOKENS` the tokenizer knows as one token (ChatML's when none)."""
    for token in END_OF_TURN_TOKENS:
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
            return token
    return END_OF_TURN


class PromptBuilder:
    def __init__(self, tokenizer, end_of_turn: str | None = None) -> None:
        """`end_of_turn`: the token closing a turn (default: the tokenizer's family's, `end_of_turn_for`)."""
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn or end_of_turn_for(tokenizer)
        self.escaper = ControlTokenEscaper(tokenizer)
        self._heads: dict[str, list[int]] | None = {} if self.escaper.is_control_token(end_of_turn) else None
        self._template = _compiled_template(tokenizer)
        special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        # globals + special tokens, merged once: each render then shares this context (the
        # merge is a third of a short render's cost)
        self._template_vars = {**self._template.globals, **special} if self._template is not None else special

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None, generation_prompt: bool) -> str:
        if self._template is None:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
            )
        messages = [
            {**{a: m["reasoning_content"] for a in _REASONING_ALIASES}, **m} if "reasoning_content" in m else m
            for m in messages
        ]
        context = self._template.new_context(
            {**self._template_vars, "messages": messages, "tools": tools or None,
             "add_generation_prompt": generation_prompt},
            shared=True,
        )
        return "".join(self._template.root_render_func(context))

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text; escaped control-token text becomes plain text."""
        return self.escaper.encode(text)

    def _encode_start(self, text: str) -> list[int]:
        """`encode(text)` for text that starts a conversation, its first turn from the cache."""
        end = text.find(self.end_of_turn) if self._heads is not None else -1
        if end < 0:
            return self.encode(text)
        end += len(self.end_of_turn)
        head = self._heads.get(text[:end])
        if head is None:
            head = self.encode(text[:end])
            if len(self._heads) >= MAX_CACHED_HEADS:
                self._heads.clear()
            self._heads[text[:end]] = head
        return head + self.encode(text[end:])

    def build(self, messages: list[dict[str, Any]], tools: list[dict] | None, cache: TitoCache) -> BuiltPrompt:
        messages, tools = self.escaper.messages(messages), self.escaper.tools(tools)
        full = self.render(messages, tools, generation_prompt=True)
        state = cache.best_state(full, len(messages))
        if state is None:
            prompt = BuiltPrompt(ids=[], text=full, num_messages=len(messages), messages=messages, tools=tools)
            cursor, first = 0, 0
        else:
            prompt = BuiltPrompt(
                ids=cache.take_ids(state), text=full, num_messages=len(messages), messages=messages, tools=tools,
                fallback_spans=list(state.fallback_spans), base=state,
            )
            cursor, first = len(state.text), state.num_messages
        for i in range(first, len(messages)):
            if messages[i].get("role") != "assistant":
                continue
            before = self.render(messages[:i], tools, generation_prompt=True)
            after = self.render(messages[: i + 1], tools, generation_prompt=False)
            if not (after.startswith(before) and full.startswith(after) and len(before) >= cursor):
                prompt.fallback_turns += 1  # position unknown: the template rewrote history
                continue
            text = after[len(before) :]
            prompt.ids += (self._encode_start if cursor == 0 else self.encode)(full[cursor : len(before)])
            segment = cache.segments.get(text)
            if segment is None:
                start = len(prompt.ids)
                prompt.ids += self.encode(text)
                prompt.fallback_spans.append((start, len(prompt.ids)))
                prompt.fallback_turns += 1
            else:
                prompt.ids += segment.output_ids + self.encode(self._tail(text, segment.ended))
                prompt.spliced_turns += 1
            cursor = len(after)
        prompt.ids += (self._encode_start if cursor == 0 else self.encode)(full[cursor:])
        return prompt

    def remember(
        self, cache: TitoCache, prompt: BuiltPrompt, assistant: dict[str, Any], output_ids: list[int], ended: bool,
    ) -> None:
        """Remember a returned turn (`assistant`, as the harness will send it back): its
        canonical text for splicing, and the prefix state of the conversation ending with it."""
        messages = prompt.messages
        after = self.render(messages + self.escaper.messages([assistant]), prompt.tools, generation_prompt=False)
        if not after.startswith(prompt.text):
            raise ValueError("chat template does not render a conversation as a prefix of its continuation")
        canonical = after[len(prompt.text) :]
        tail_ids = list(output_ids) + self.encode(self._tail(canonical, ended))
        state = PrefixState(after, prompt.ids, tail_ids, len(messages) + 1, prompt.fallback_spans,
                            ready=prompt.ids + tail_ids)
        cache.remember(canonical, Segment(list(output_ids), ended), state)

    def _tail(self, canonical: str, ended: bool) -> str:
        """What the template adds after the sampled tokens: the separator after the
        end-of-turn marker, or (output cut at max tokens) the marker too."""
        end = canonical.rfind(self.end_of_turn)
        if end < 0:
            return ""
        return canonical[end + len(self.end_of_turn) :] if ended else canonical[end:]
