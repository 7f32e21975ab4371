"""Call records survive the process that made them: on disk within a second of the answer.

`gyre proxy serve` appends every call to its DuckDB record in batches at least every
second (`gyre/storage/call_log.py`): a kill -9 loses at most the calls answered in its
last second, SIGTERM loses none, not even a call in flight when the signal arrives. A run's
proxy hands its calls to the same `CallLog` on the run's store, so they are readable while
the run goes on; a failed append is raised, never swallowed.
"""

from __future__ import annotations

import json
import os
import signal
import time

import duckdb
import httpx
import pytest

from gyre.engines.models.hf import stop_token_ids
from gyre.net.server_thread import ServerThread
from gyre.proxy.app import create_app
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import SessionRegistry
from gyre.records import Call
from gyre.storage.call_log import CallLog, CallLogError
from gyre.storage.store import RunStore
from tests.fakes import ScriptedEngine
from tests.serve_process import start_gyre_proxy_serve

KEYS = {"key-a": "exec-a", "key-b": "exec-b"}
MIN_CALLS = 12
CALLING_S = 3.0
"""Calls go on for at least this long before the kill, so some are older than a second."""
MAX_CALLS = 2000
ON_DISK_WITHIN_S = 1.0


def _chat(client: httpx.Client, port: int, key: str) -> str:
    """One answered call; returns its call id."""
    r = client.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                    json={"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                    timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["id"].removeprefix("chatcmpl-")


def _on_disk(record) -> set[str]:
    """Call ids in the record; each with its tokens (a batch is one transaction)."""
    con = duckdb.connect(str(record), read_only=True)
    try:
        ids = {row[0] for row in con.execute("select call_id from calls").fetchall()}
        tokens = {row[0] for row in con.execute("select call_id from call_tokens").fetchall()}
    finally:
        con.close()
    assert ids == tokens
    return ids


@pytest.mark.slow
def test_kill_9_loses_at_most_the_last_second_of_calls(tmp_path, tiny_model_dir):
    child, port, record = start_gyre_proxy_serve(tmp_path, tiny_model_dir, KEYS)
    answered: dict[str, float] = {}
    try:
        with httpx.Client() as client:
            for i in range(MAX_CALLS):
                answered[_chat(client, port, "key-a" if i % 2 else "key-b")] = time.monotonic()
                if len(answered) >= MIN_CALLS and time.monotonic() - min(answered.values()) >= CALLING_S:
                    break
        killed_at = time.monotonic()
        os.kill(child.proc.pid, signal.SIGKILL)
        assert child.proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        child.stop()
    on_disk = _on_disk(record)
    old = {call for call, at in answered.items() if at < killed_at - ON_DISK_WITHIN_S}
    assert len(old) >= MIN_CALLS // 2, "the test must kill well after some calls were answered"
    assert old <= on_disk, f"{len(old - on_disk)} of {len(old)} calls answered over 1 s before the kill are lost"
    assert on_disk <= set(answered)


@pytest.mark.slow
def test_sigterm_loses_no_call_not_even_one_in_flight(tmp_path, tiny_model_dir):
    child, port, record = start_gyre_proxy_serve(tmp_path, tiny_model_dir, KEYS)
    try:
        with httpx.Client() as client:
            answered = {_chat(client, port, key) for key in ["key-a", "key-b"] * 4}
            with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                               headers={"Authorization": "Bearer key-a"},
                               json={"model": "tiny", "max_tokens": 64, "stream": True,
                                     "messages": [{"role": "user", "content": "tell me more"}]}) as response:
                events = (line for line in response.iter_lines() if line.startswith("data: "))
                first = next(events)
                os.kill(child.proc.pid, signal.SIGTERM)  # while the streamed call is being generated
                rest = list(events)
        assert rest[-1] == "data: [DONE]", rest[-3:]  # the call in flight was answered in full
        in_flight = json.loads(first[6:])["id"].removeprefix("chatcmpl-")
        assert child.proc.wait(timeout=60) == 128 + signal.SIGTERM, child.output()
    finally:
        child.stop()
    assert _on_disk(record) == answered | {in_flight}


def test_a_runs_calls_are_readable_while_its_proxy_serves(tmp_path, tiny_tokenizer):
    store = RunStore(tmp_path / "gyre.duckdb")
    call_log = CallLog(store)
    sessions = SessionRegistry(sink=call_log.put)  # how the coordinator wires its proxy
    engine = ScriptedEngine(tiny_tokenizer, ["one", "two", "three"])
    app = create_app(EngineRouter([engine]), sessions, tiny_tokenizer, model_name="tiny",
                     stop_token_ids=stop_token_ids(tiny_tokenizer))
    key = sessions.mint("exec-1")
    try:
        with ServerThread(app) as server, httpx.Client() as client:
            for _ in range(3):
                r = client.post(f"{server.base_url}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                json={"messages": [{"role": "user", "content": "hi"}]}, timeout=60)
                assert r.status_code == 200, r.text
            answered = time.monotonic()
            stored = 0
            while stored < 3 and time.monotonic() - answered < ON_DISK_WITHIN_S:  # no flush, no close
                time.sleep(0.02)
                stored = store.query("select count(*) from calls")[0][0]
            assert stored == 3, f"{stored} of 3 calls on disk {ON_DISK_WITHIN_S} s after they were answered"
        recorded = sessions.close("exec-1").calls
        rows = store.query("select c.call_id, t.output_ids from calls c join call_tokens t using (call_id) "
                           "order by c.started_at")
        assert rows == [(c.call_id, c.output_ids) for c in recorded]
    finally:
        call_log.close()
        store.close()


def test_a_failed_append_is_raised_not_swallowed(tmp_path):
    store = RunStore(tmp_path / "gyre.duckdb")
    call_log = CallLog(store, flush_interval_s=0.01)
    call = Call(call_id="c", execution_id="e", prompt_ids=[1], output_ids=[2], logprobs=[-1.0], policy_version=0,
                engine_id="x", finish_reason="stop")
    store.close()  # the file is gone from under the log
    call_log.put(call)
    with pytest.raises(CallLogError, match="appending calls"):
        for _ in range(500):  # the background flush fails within a few intervals
            time.sleep(0.01)
            call_log.put(call)
    with pytest.raises(CallLogError):
        call_log.close()
