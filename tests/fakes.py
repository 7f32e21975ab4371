"""A scripted rollout engine: the model edge faked, everything else real.

It answers each request with the next scripted text (tokenised, plus the end-of-turn
token) so harness and proxy behaviour that depends on what the model says (tool calls,
finish) can be tested deterministically. Its log-probs are a fixed -1.0 per token.
"""

from __future__ import annotations

import threading
from pathlib import Path

from gyre.engines.base import GenerationRequest, GenerationResult


class ScriptedEngine:
    def __init__(self, tokenizer, replies: list[str], engine_id: str = "scripted-0") -> None:
        self.engine_id = engine_id
        self._tokenizer = tokenizer
        self._replies = list(replies)
        self._lock = threading.Lock()
        self.prompts: list[list[int]] = []
        self._version = 0

    @property
    def policy_version(self) -> int:
        return self._version

    def generate(self, request: GenerationRequest) -> GenerationResult:
        with self._lock:
            self.prompts.append(list(request.prompt_ids))
            text = self._replies.pop(0) if self._replies else ""
        ids = self._tokenizer(text, add_special_tokens=False)["input_ids"]
        ids.append(self._tokenizer.convert_tokens_to_ids("<|im_end|>"))
        return GenerationResult(ids, [-1.0] * len(ids), "stop", self._version, self.engine_id)

    def load_weights(self, snapshot: Path, version: int) -> None:
        self._version = version

    def close(self) -> None:
        pass
