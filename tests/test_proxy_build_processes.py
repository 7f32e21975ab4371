"""Prompt builds in worker processes (`build_processes.py`): the same prompts, spliced ids and fallbacks
as builds in the proxy's own process, over real HTTP with real worker processes; a killed worker is
replaced, and what it knew is then counted as fallback, never passed off as sampled."""

from __future__ import annotations

import time

import httpx
import pytest

from gyre.engines.models.hf import stop_token_ids
from gyre.net.server_thread import ServerThread
from gyre.proxy.app import create_app
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import SessionRegistry
from tests.fakes import ScriptedEngine

TOOLS = [{"type": "function", "function": {"name": "run_shell", "description": "Run a command.",
                                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                          "required": ["cmd"]}}}]
REPLIES = [
    'Looking.\n<tool_call>\n{"name": "run_shell", "arguments": {"cmd": "ls"}}\n</tool_call>',
    "<think>the tests</think>\nRunning them.\n<tool_call>\n"
    '{"name": "run_shell", "arguments": {"cmd": "pytest -q"}}\n</tool_call>',
    "All pass.",
    "Done.",
    "Bye.",
]


def _proxy(tokenizer, build_processes: int):
    sessions = SessionRegistry()
    app = create_app(EngineRouter([ScriptedEngine(tokenizer, list(REPLIES))]), sessions, tokenizer,
                     model_name="tiny", stop_token_ids=stop_token_ids(tokenizer), build_processes=build_processes)
    return ServerThread(app).start(), sessions, app.state.core.builds


@pytest.fixture
def proxies(tiny_tokenizer):
    started = [_proxy(tiny_tokenizer, 0), _proxy(tiny_tokenizer, 1)]
    try:
        yield started
    finally:
        for server, _, builds in started:
            server.stop()
            if builds is not None:
                builds.close()


def _post(server, key, messages, status=200):
    r = httpx.post(f"{server.base_url}/chat/completions", timeout=60, headers={"Authorization": f"Bearer {key}"},
                   json={"messages": messages, "tools": TOOLS, "max_tokens": 64})
    assert r.status_code == status, r.text
    return r.json()["choices"][0]["message"] if status == 200 else r.json()


def _conversation(server, key) -> None:
    """Four calls echoing the proxy's answers, with tool results; the third edits an earlier answer (a
    harness that compacts), the fourth changes the first user message (an equal-but-new prefix)."""
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
    for turn in range(4):
        answer = _post(server, key, messages)
        messages = [*messages, {k: v for k, v in answer.items() if v is not None}]
        for call in answer.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"output {turn}\n" * 50})
        if not answer.get("tool_calls"):
            messages.append({"role": "user", "content": f"Go on ({turn})."})
        if turn == 1:
            messages[2] = {**messages[2], "content": "Looking (edited by the harness)."}
        if turn == 2:
            messages[1] = {"role": "user", "content": "Fix the bug, please."}


def test_builds_in_a_worker_process_give_the_prompts_of_builds_in_the_proxy(proxies):
    recorded = []
    for server, sessions, _ in proxies:
        _conversation(server, sessions.mint("e"))
        recorded.append(sessions.close("e"))
    here, worker = recorded
    assert len(here.calls) == len(worker.calls) == 4
    for a, b in zip(here.calls, worker.calls):
        assert b.prompt_ids == a.prompt_ids
        assert b.output_ids == a.output_ids
        assert b.prompt_fallback_spans == a.prompt_fallback_spans
    assert worker.fallback_turns == here.fallback_turns > 0  # the edited answer fell back, counted the same
    assert worker.calls[1].prompt_ids[: len(worker.calls[0].prompt_ids)] == worker.calls[0].prompt_ids  # spliced


def test_a_killed_worker_is_replaced_and_what_it_knew_falls_back(proxies):
    server, sessions, builds = proxies[1]
    key = sessions.mint("e")
    messages = [{"role": "user", "content": "Fix the bug."}]
    for _ in range(2):
        answer = _post(server, key, messages)
        messages += [{k: v for k, v in answer.items() if v is not None},
                     *({"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in answer["tool_calls"])]
    shard = builds._shards[0]
    shard.process.kill()
    shard.process.wait(30)
    deadline = time.monotonic() + 30
    while not shard.dead and time.monotonic() < deadline:  # the proxy notices the end of its socket
        time.sleep(0.01)
    assert shard.dead
    _post(server, key, messages)  # built by a new worker, from nothing
    assert builds._shards[0] is not shard and builds._shards[0].process.poll() is None
    calls = sessions.close("e").calls
    assert len(calls) == 3
    assert calls[1].prompt_fallback_spans == []  # spliced by the first worker
    assert len(calls[2].prompt_fallback_spans) == 2  # both returned turns are template tokens now, marked


def test_executions_go_to_the_least_loaded_worker_and_closing_stops_every_worker(tiny_tokenizer):
    server, sessions, builds = _proxy(tiny_tokenizer, 2)
    try:
        for name in ("a", "b", "c"):
            _post(server, sessions.mint(name), [{"role": "user", "content": "hi"}])
        assert sorted(builds._executions) == [1, 2]
        for name in ("a", "b"):
            sessions.close(name)  # its worker drops its state (sent on the loop)
        deadline = time.monotonic() + 30
        while sum(builds._executions) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sum(builds._executions) == 1
        _post(server, sessions.mint("d"), [{"role": "user", "content": "hi"}])
        assert builds._executions == [1, 1]
    finally:
        server.stop()
        processes = [s.process for s in builds._shards if s is not None] + [p for _, p in filter(None, builds._spawned)]
        builds.close()
    assert len(processes) == 2 and all(p.poll() is not None for p in processes)
