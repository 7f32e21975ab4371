"""Stop strings (OpenAI `stop`, Anthropic `stop_sequences`): where to cut an output.

Engines stop on token ids; a harness asks to stop on text. The matcher watches the
decoded text of the output as tokens arrive, and when it first contains a stop string
(the one that completes earliest; on a tie, the longest) it says where the output ends.

What is kept: the output is cut at a token boundary, before the token in which the stop
string begins. The harness is shown the text of exactly the kept tokens, the record holds
exactly those tokens and their behaviour log-probs, and TITO splices exactly those ids
back when the harness returns the turn: what was trained, what the harness saw and what
the model sees next are the same tokens. The token(s) holding the stop string, and any the
engine sampled before it noticed, are dropped; the kept tokens are a prefix of a sample,
so still an exact sample (like an output cut at max tokens, it has no end-of-turn token).
When a stop string begins inside a token, the text shown is therefore a little shorter
than "everything before the stop string" (the start of that token is missing).

Until a match is ruled out, tokens whose text could begin a stop string are held back
(`push` returns only ids that are safe to show), so a streaming client never sees text
that a later cut removes. Boundaries count only where the decoded text is whole (no
partial UTF-8 character pending).
"""

from __future__ import annotations

from gyre.proxy.output import IncrementalDecoder


def _held_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        tail = text[len(text) - min(len(stop) - 1, len(text)) :]
        at = tail.find(stop[0])
        while 0 <= at < len(tail) - best:
            if stop.startswith(tail[at:]):
                best = len(tail) - at
                break
            at = tail.find(stop[0], at + 1)
    return best


class StopMatcher:
    def __init__(self, tokenizer, stops: tuple[str, ...], skip_ids: frozenset[int] = frozenset()) -> None:
        if not stops or any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = stops
        self._longest = max(len(s) for s in stops)
        self._skip_ids = skip_ids  # end-of-turn ids: they end the output, their text is no match
        self._decoder = IncrementalDecoder(tokenizer)
        self._text = ""
        self._boundaries: list[tuple[int, int]] = [(0, 0)]  # (ids, text length) where the text is whole
        self.ids: list[int] = []
        self.released = 0
        self.matched: str | None = None
        """The stop string found, once found."""
        self.keep: int | None = None
        """Output tokens to keep once a stop string was found."""

    def push(self, ids: list[int]) -> list[int]:
        """Feed output ids in order; returns the ids now safe to show (possibly none)."""
        if self.matched is not None:
            return []
        searched = len(self._text)
        for tok in ids:
            self.ids.append(tok)
            if tok in self._skip_ids:
                if self._boundaries[-1][0] == len(self.ids) - 1:
                    self._boundaries.append((len(self.ids), len(self._text)))
                continue
            delta = self._decoder.push([tok])
            if delta:
                self._text += delta
                self._boundaries.append((len(self.ids), len(self._text)))
        start = self._find(max(0, searched - self._longest + 1))
        if start is not None:
            self.keep = self._boundary_before(start)
            return self._release(self.keep)
        return self._release(self._boundary_before(len(self._text) - _held_suffix(self._text, self._stops)))

    def flush(self) -> list[int]:
        """The output ended without a stop string: everything not yet shown."""
        return [] if self.matched is not None else self._release(len(self.ids))

    def _find(self, offset: int) -> int | None:
        """Start of the earliest-completing stop string in the text from `offset` on."""
        best: tuple[int, int, str] | None = None  # (end, -length, stop)
        for stop in self._stops:
            at = self._text.find(stop, offset)
            if at >= 0 and (best is None or (at + len(stop), -len(stop)) < best[:2]):
                best = (at + len(stop), -len(stop), stop)
        if best is None:
            return None
        self.matched = best[2]
        return best[0] + best[1]

    def _boundary_before(self, text_pos: int) -> int:
        """Most ids whose (whole) text ends at or before `text_pos`."""
        for num_ids, length in reversed(self._boundaries):
            if length <= text_pos:
                return num_ids
        return 0

    def _release(self, upto: int) -> list[int]:
        if upto <= self.released:
            return []
        out = self.ids[self.released : upto]
        self.released = upto
        return out
