"""Where a call's prompt is built: on the event loop when nothing else is in flight and its new text
is short (`completion.INLINE_BUILD_CHARS`), in a prompt lane otherwise. Over real HTTP, with the
real builder watched (the thread each build ran in) and a scripted engine that can hold a call."""

from __future__ import annotations

import threading

import httpx
import pytest

from gyre.engines.models.hf import stop_token_ids
from gyre.net.server_thread import ServerThread
from gyre.proxy.app import create_app
from gyre.proxy.completion import INLINE_BUILD_CHARS
from gyre.proxy.prompt import PromptBuilder
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import SessionRegistry
from tests.fakes import ScriptedEngine

HOLD = "hold this call"
HOLD_BUILD = "hold this build"


class HoldingEngine(ScriptedEngine):
    """Answers like `ScriptedEngine`; a prompt that says `HOLD` waits for `release` first."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, [])
        self.holding, self.release = threading.Event(), threading.Event()

    def generate(self, request):
        if HOLD in self._tokenizer.decode(request.prompt_ids):
            self.holding.set()
            assert self.release.wait(30)
        return super().generate(request)


class Builds(list):
    """Per build, in order: whether it ran in a prompt lane (else on the event loop). A build whose last
    message says `HOLD_BUILD` waits for `release` first (`building` is set while it waits)."""

    def __init__(self) -> None:
        super().__init__()
        self.building, self.release = threading.Event(), threading.Event()


@pytest.fixture
def builds(monkeypatch):
    where = Builds()
    real = PromptBuilder.build

    def watched(self, messages, tools, cache):
        where.append(threading.current_thread().name.startswith("gyre-prompt"))
        if HOLD_BUILD in str(messages[-1].get("content")):
            where.building.set()
            assert where.release.wait(30)
        return real(self, messages, tools, cache)

    monkeypatch.setattr(PromptBuilder, "build", watched)
    yield where
    where.release.set()


@pytest.fixture
def proxy(tiny_tokenizer):
    engine = HoldingEngine(tiny_tokenizer)
    sessions = SessionRegistry()
    app = create_app(EngineRouter([engine]), sessions, tiny_tokenizer, model_name="tiny",
                     stop_token_ids=stop_token_ids(tiny_tokenizer))
    server = ServerThread(app).start()
    try:
        yield server, sessions, engine
    finally:
        engine.release.set()
        server.stop()


def _post(server, key, messages):
    r = httpx.post(f"{server.base_url}/chat/completions", json={"messages": messages, "max_tokens": 8},
                   headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def test_a_lone_call_with_short_new_text_is_built_on_the_loop_and_a_long_one_in_a_lane(proxy, builds):
    server, sessions, _ = proxy
    key = sessions.mint("e")
    long_log = "x = 1\n" * (INLINE_BUILD_CHARS // 6 + 1)  # more than the bound, once
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    messages += [_post(server, key, messages), {"role": "user", "content": long_log}]
    messages += [_post(server, key, messages), {"role": "user", "content": "short again"}]
    _post(server, key, messages)
    # first call: all of it is new and short; second: a long new message; third: only "short again"
    # is new, though the conversation now holds more than the bound
    assert builds == [False, True, False]
    calls = sessions.close("e").calls
    assert calls[2].prompt_ids[: len(calls[1].prompt_ids)] == calls[1].prompt_ids  # spliced as ever


def test_a_first_call_carrying_a_long_history_is_built_in_a_lane(proxy, builds):
    """Nothing of the execution is remembered yet, so all of it is new text, before its last
    assistant turn too (a harness resuming a conversation)."""
    server, sessions, _ = proxy
    long_log = "x = 1\n" * (INLINE_BUILD_CHARS // 6 + 1)
    _post(server, sessions.mint("e"), [{"role": "user", "content": long_log}, {"role": "assistant", "content": "ok"},
                                       {"role": "user", "content": "go on"}])
    assert builds == [True]


def test_a_call_made_while_another_is_in_flight_is_built_in_a_lane(proxy, builds):
    server, sessions, engine = proxy
    held_key, key = sessions.mint("held"), sessions.mint("e")
    held = threading.Thread(target=_post, args=(server, held_key, [{"role": "user", "content": HOLD}]))
    held.start()
    try:
        assert engine.holding.wait(30)
        _post(server, key, [{"role": "user", "content": "short"}])
    finally:
        engine.release.set()
        held.join(30)
    _post(server, key, [{"role": "user", "content": "short"}, {"role": "assistant", "content": ""},
                        {"role": "user", "content": "alone now"}])
    assert builds == [False, True, False]  # the held call (alone), the one beside it, then alone again


def test_a_call_made_while_another_is_being_built_in_a_lane_is_built_in_a_lane(proxy, builds):
    server, sessions, _ = proxy
    long_log = "x = 1\n" * (INLINE_BUILD_CHARS // 6 + 1) + HOLD_BUILD  # a lane's build, held there
    held = threading.Thread(target=_post, args=(server, sessions.mint("held"), [{"role": "user", "content": long_log}]))
    held.start()
    try:
        assert builds.building.wait(30)
        _post(server, sessions.mint("e"), [{"role": "user", "content": "short"}])
    finally:
        builds.release.set()
        held.join(30)
    assert builds == [True, True]
