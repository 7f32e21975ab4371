"""One huge request delays no other: prompt work runs off the event loop, and a prompt that
cannot fit the context is refused before any of it.

A null-engine proxy (`tests/serve_process.py`: the real app, the tiny tokenizer and chat
template, the tiny model's 8192-token context, an engine that answers at once) is loaded
with heavy requests whose prompts are just under the context's character bound (each
templated and tokenised for about a second: worker threads, the helper process) and an
8 MB prompt (over the bound: refused with a 400 that names its length, long before
tokenising it could have finished). Meanwhile 100 small requests of other executions keep
their p99 under 100 ms and `/health` (polled every 5 ms) its p99 under 50 ms.

Latency on a shared 2-core box is noisy, so each round first times the same requests on
the idle server, and the bounds are asserted on what the load adds (loaded p99 minus idle
p99) and on the absolute p99; a round that misses them (a burst of other work on the box)
is measured again, at most `MAX_ROUNDS` times. Every round's numbers are printed (`-s`).
With templating on the event loop every round misses by an order of magnitude (p99 ~0.8 s).

The bound itself (`gyre/proxy/limits.py`) counts system, user and tool content, never
assistant turns, and refuses on both APIs and `count_tokens` before any engine is asked.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from dataclasses import dataclass

import httpx
import orjson
import pytest

from gyre.proxy.limits import PromptLimit
from tests.fakes import ScriptedEngine, serve_proxy
from tests.serve_process import start_null_proxy

CONTEXT_TOKENS = 8192
HEAVY_CHARS = 125_000
"""Under the bound (8192 tokens x 16 characters, the tiny vocabulary's longest entry)."""
HUGE_BYTES = 8 * 2**20
NUM_SMALL = 100
SMALL_P99_MS = 100.0
HEALTH_MS = 50.0
HEAVY_SENDERS = 2
HEAVY_BODIES = 16
"""Distinct heavy prompts per sender and round (fresh text: nothing is served from a cache); enough that no
sender runs out before the small requests end (a sender stops at once when they do). With 6, a quiet box
served them all early and the overlap check failed 2 runs in 12."""
HUGE_AFTER_SMALL = 20
"""The 8 MB prompt is sent once this many small requests have been answered."""
MAX_ROUNDS = 5


def _small_body(i: int) -> bytes:
    return orjson.dumps({"model": "null", "max_tokens": 8, "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Create calc.py with add(a, b), step {i}. Then run the tests."}]})


def _heavy_body(rng: random.Random) -> bytes:
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    text = " ".join(rng.choice(words) for _ in range(HEAVY_CHARS // 5))[:HEAVY_CHARS]
    return orjson.dumps({"model": "null", "max_tokens": 8, "messages": [{"role": "user", "content": text}]})


def _post(client: httpx.Client, port: int, key: str, body: bytes) -> httpx.Response:
    return client.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=body, timeout=120,
                       headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


def _small_latencies_ms(port: int, keys: list[str], on_answer=lambda n: None) -> list[float]:
    out = []
    with httpx.Client() as client:
        for i in range(NUM_SMALL):
            body = _small_body(i)
            t0 = time.perf_counter()
            r = _post(client, port, keys[i % len(keys)], body)
            out.append((time.perf_counter() - t0) * 1e3)
            assert r.status_code == 200, r.text
            on_answer(i + 1)
    return out


def _health_ms(client: httpx.Client, port: int) -> float:
    t0 = time.perf_counter()
    assert client.get(f"http://127.0.0.1:{port}/health", timeout=60).status_code == 200
    return (time.perf_counter() - t0) * 1e3


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


@dataclass
class Round:
    idle_p99_ms: float
    loaded_p99_ms: float
    idle_health_p99_ms: float
    health_p99_ms: float
    num_health: int
    heavy_s: list[float]
    huge_s: float

    def meets_bounds(self) -> bool:
        return (self.loaded_p99_ms - self.idle_p99_ms < SMALL_P99_MS and self.loaded_p99_ms < SMALL_P99_MS
                and self.health_p99_ms - self.idle_health_p99_ms < HEALTH_MS and self.health_p99_ms < HEALTH_MS)


def _round(port: int, keys: list[str], rng: random.Random, huge: bytes) -> Round:
    """Idle baseline, then the same small requests while heavy and huge ones arrive.
    Asserts what must hold in every round (heavy ones served all along, the huge one refused)."""
    heavy_keys, huge_key, small_keys = keys[:HEAVY_SENDERS], keys[HEAVY_SENDERS], keys[HEAVY_SENDERS + 1:]
    heavy = [[_heavy_body(rng) for _ in range(HEAVY_BODIES)] for _ in range(HEAVY_SENDERS)]
    idle_ms = _small_latencies_ms(port, small_keys)
    with httpx.Client() as client:
        idle_health_ms = [_health_ms(client, port) for _ in range(NUM_SMALL)]

    stop, send_huge_now = threading.Event(), threading.Event()
    heavy_spans: list[tuple[float, float, int]] = []
    health_ms: list[float] = []
    huge_result: dict = {}

    def send_heavy(k: int) -> None:
        with httpx.Client() as client:
            for body in heavy[k]:
                if stop.is_set():
                    return
                t0 = time.perf_counter()
                status = _post(client, port, heavy_keys[k], body).status_code
                heavy_spans.append((t0, time.perf_counter(), status))

    def send_huge() -> None:
        send_huge_now.wait(300)
        with httpx.Client() as client:
            t0 = time.perf_counter()
            r = _post(client, port, huge_key, huge)
            huge_result.update(s=time.perf_counter() - t0, status=r.status_code, body=r.json())

    def poll_health() -> None:
        with httpx.Client() as client:
            for _ in range(20_000):
                if stop.is_set():
                    return
                health_ms.append(_health_ms(client, port))
                time.sleep(0.005)

    threads = [threading.Thread(target=send_heavy, args=(k,)) for k in range(HEAVY_SENDERS)]
    threads += [threading.Thread(target=send_huge), threading.Thread(target=poll_health)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)  # the heavy prompts are being templated and tokenised
        start = time.perf_counter()
        loaded_ms = _small_latencies_ms(port, small_keys, lambda n: n == HUGE_AFTER_SMALL and send_huge_now.set())
        end = time.perf_counter()
    finally:
        send_huge_now.set()
        stop.set()
        for t in threads:
            t.join(timeout=300)

    # the load was real: heavy requests in flight through the whole measurement, and served
    assert all(status == 200 for *_, status in heavy_spans) and len(heavy_spans) >= HEAVY_SENDERS
    covered = sum(max(0.0, min(e, end) - max(s, start)) for s, e, _ in heavy_spans)
    assert covered >= 0.9 * (end - start) * HEAVY_SENDERS, "heavy requests must overlap the small ones"
    # the 8 MB prompt: a clear 400 naming its length, without tokenising it (that takes ~20 s)
    assert huge_result["status"] == 400 and huge_result["s"] < 10
    error = huge_result["body"]["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert f"hold {HUGE_BYTES} characters" in error["message"] and "8192 tokens" in error["message"]
    return Round(_p99(idle_ms), _p99(loaded_ms), _p99(idle_health_ms), _p99(health_ms), len(health_ms),
                 [e - s for s, e, _ in heavy_spans], huge_result["s"])


@pytest.mark.slow
def test_small_requests_and_health_stay_fast_while_huge_prompts_arrive():
    child, port, keys = start_null_proxy(num_keys=16, max_context_tokens=CONTEXT_TOKENS)
    rounds: list[Round] = []
    try:
        rng = random.Random(0)
        huge = orjson.dumps({"model": "null", "max_tokens": 8,
                             "messages": [{"role": "user", "content": "x " * (HUGE_BYTES // 2)}]})
        # warm up: template heads, connections, and the tokenizer's helper process (started by the
        # first long text, once per proxy: its start-up is not what a request costs)
        _small_latencies_ms(port, keys[HEAVY_SENDERS + 1:])
        with httpx.Client() as client:
            assert _post(client, port, keys[0], _heavy_body(rng)).status_code == 200
        for _ in range(MAX_ROUNDS):
            rounds.append(_round(port, keys, rng, huge))
            print(rounds[-1])
            if rounds[-1].meets_bounds():
                break
    finally:
        child.stop()
    assert rounds[-1].meets_bounds(), f"every round missed the latency bounds: {rounds}"


def test_a_prompt_that_cannot_fit_the_context_is_refused_before_templating(tiny_tokenizer):
    limit = PromptLimit.for_tokenizer(tiny_tokenizer, 64)
    assert limit.max_token_chars == max(len(t) for t in tiny_tokenizer.get_vocab())  # no normalizer: 1 x longest
    engine = ScriptedEngine(tiny_tokenizer, ["fine"] * 4)
    server, sessions, _ = serve_proxy([engine], tiny_tokenizer, max_context_tokens=64)
    key = sessions.mint("e")
    over, under = "y" * (limit.max_chars + 1), "y" * 40
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=60) as client:
            oa = {"Authorization": f"Bearer {key}"}
            r = client.post("/v1/chat/completions", headers=oa, json={"messages": [
                {"role": "assistant", "content": over}, {"role": "user", "content": under}]})
            assert r.status_code == 200, r.text  # assistant turns are not counted (templates may rewrite them)
            r = client.post("/v1/chat/completions", headers=oa, json={"messages": [{"role": "tool", "content": over}]})
            error = r.json()["error"]
            assert r.status_code == 400 and error["code"] == "context_length_exceeded" and error["param"] == "messages"
            assert f"hold {limit.max_chars + 1} characters" in error["message"] and "64 tokens" in error["message"]
            for path in ("/v1/messages", "/v1/messages/count_tokens"):
                r = client.post(path, headers={"x-api-key": key}, json={
                    "max_tokens": 4, "system": over[:limit.max_chars // 2],
                    "messages": [{"role": "user", "content": over[:limit.max_chars // 2 + 1]}]})
                assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
                assert "prompt too long" in r.json()["error"]["message"]
        assert len(engine.prompts) == 1  # only the request under the bound reached an engine
    finally:
        server.stop()
