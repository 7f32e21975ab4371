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
            if callable(text):  # a reply that reads its prompt (what the last observation said)
                text = text(self._tokenizer.decode(request.prompt_ids))
        ids = self._tokenizer(text, add_special_tokens=False)["input_ids"]
        ids.append(self._tokenizer.convert_tokens_to_ids("<|im_end|>"))
        return GenerationResult(ids, [-1.0] * len(ids), "stop", self._version, self.engine_id)

    def load_weights(self, snapshot: Path, version: int) -> None:
        self._version = version

    def close(self) -> None:
        pass


class SpyEngine:
    """A real engine, watched: every request it gets and every result it returns."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.engine_id = inner.engine_id
        self.requests: list[GenerationRequest] = []
        self.results: list[GenerationResult] = []
        self.tokens_sampled = 0
        self._lock = threading.Lock()

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def generate(self, request: GenerationRequest) -> GenerationResult:
        if request.on_token is not None:
            report = request.on_token

            def on_token(token_id: int, logprob: float) -> None:
                self.tokens_sampled += 1
                report(token_id, logprob)

            request = GenerationRequest(request.prompt_ids, request.params, request.stop, on_token)
        result = self.inner.generate(request)
        with self._lock:
            self.requests.append(request)
            self.results.append(result)
        return result

    def load_weights(self, snapshot: Path, version: int) -> None:
        self.inner.load_weights(snapshot, version)

    def close(self) -> None:
        self.inner.close()


class BrokenEngine:
    """An engine that reports `token_ids` through `on_token` and then fails, like a rollout
    server whose connection resets mid-request."""

    def __init__(self, token_ids: list[int], engine_id: str = "broken-0") -> None:
        self.engine_id = engine_id
        self.token_ids = token_ids
        self.calls = 0

    @property
    def policy_version(self) -> int:
        return 0

    def generate(self, request: GenerationRequest) -> GenerationResult:
        self.calls += 1
        for tok in self.token_ids[: request.params.max_new_tokens]:
            if request.on_token is not None:
                request.on_token(tok, -0.5)
        raise ConnectionResetError("engine went away")

    def load_weights(self, snapshot: Path, version: int) -> None:
        pass

    def close(self) -> None:
        pass


class TokenByTokenEngine:
    """The model edge faked: samples the tokens of a fixed text one at a time (reporting
    each through on_token, log-prob -0.25), honouring the stop event between tokens."""

    def __init__(self, tokenizer, text: str, engine_id: str = "steady-0", token_s: float = 0.002) -> None:
        self.engine_id, self.policy_version = engine_id, 0
        self.ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        self.token_s = token_s
        self.results: list[GenerationResult] = []

    def generate(self, request):
        out = []
        for tok in self.ids[: request.params.max_new_tokens]:
            if request.stop is not None and request.stop.wait(self.token_s):
                break
            out.append(tok)
            if request.on_token is not None:
                request.on_token(tok, -0.25)
        finish = "abort" if len(out) < min(len(self.ids), request.params.max_new_tokens) else "length"
        self.results.append(GenerationResult(out, [-0.25] * len(out), finish, 0, self.engine_id))
        return self.results[-1]

    def load_weights(self, snapshot, version):
        pass

    def close(self):
        pass


def serve_proxy(engines, tokenizer, *, max_wait_s: float = 5.0, **kwargs):
    """The real proxy over HTTP on 127.0.0.1 in front of `engines`: (server, sessions, router)."""
    from gyre.engines.models.hf import stop_token_ids
    from gyre.net.server_thread import ServerThread
    from gyre.proxy.app import create_app
    from gyre.proxy.router import EngineRouter
    from gyre.proxy.sessions import SessionRegistry

    sessions = SessionRegistry()
    router = EngineRouter(list(engines), max_wait_s=max_wait_s)
    kwargs.setdefault("stop_token_ids", stop_token_ids(tokenizer))
    app = create_app(router, sessions, tokenizer, model_name="tiny", **kwargs)
    return ServerThread(app).start(), sessions, router
