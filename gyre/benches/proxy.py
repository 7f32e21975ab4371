"""The proxy benchmark: what the proxy adds to a model call, against a null engine.

The proxy sits on every model call of every execution, so its cost must stay far below
an engine's. The benchmark serves the real app (real uvicorn, real TITO prompt building
with the bundled tokenizer and chat template, real recording) in a child process, in
front of a `NullEngine` that answers instantly with fixed tokens, and drives it from this
process over keep-alive HTTP/1.1 connections with a minimal client (a load generator
should not be what is measured):

- latency: sequential requests, one connection; overhead = proxy round trip minus a
  direct `NullEngine.generate` call timed in the same run; p50 and p99.
- throughput: `concurrency` connections for `duration_s`, completed requests per second.

Both OpenAI (`/v1/chat/completions`) and Anthropic (`/v1/messages`) requests are measured.
The load average is reported next to the numbers: on a shared box it explains them.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import orjson

from gyre.engines.base import GenerationRequest, GenerationResult, SamplingParams
from gyre.proxy.gc_tuning import GC_THRESHOLD0, serving_gc

TARGETS = {"p50_overhead_ms": 1.0, "p99_overhead_ms": 5.0, "requests_per_s": 1500.0}
"""The proxy issue's targets on 2 cores."""
NUM_EXECUTIONS = 64
LATENCY_REQUESTS = 2000
WARMUP_REQUESTS = 300
DEFAULT_DURATION_S = 3.0
DEFAULT_CONCURRENCY = 32
CLOCK_TICK_S = 1 / os.sysconf("SC_CLK_TCK")
"""The unit /proc counts CPU time in: every reading of `cpu_seconds` and `thread_cpu_seconds` is whole ticks."""


class NullEngine:
    """A rollout engine that answers every request at once with the same fixed tokens."""

    def __init__(self, output_ids: list[int], engine_id: str = "null-0") -> None:
        self.engine_id = engine_id
        self._output_ids = list(output_ids)
        self._logprobs = [-1.0] * len(output_ids)

    @property
    def policy_version(self) -> int:
        return 0

    def generate(self, request: GenerationRequest) -> GenerationResult:
        return GenerationResult(list(self._output_ids), list(self._logprobs), "stop", 0, self.engine_id)

    def submit(self, request: GenerationRequest) -> Future:
        """`engines.base.Submits`, as the torch engine offers it: answered while taken."""
        future: Future = Future()
        future.set_result(self.generate(request))
        return future

    def load_weights(self, snapshot: Path, version: int) -> None:
        pass

    def close(self) -> None:
        pass


START_TIMEOUT_S = 120.0
"""How long the benchmark's proxy child may take to serve."""
START_POLL_S = 0.5
"""How often the parent checks that the child is still alive while it waits."""


def _tokenizer():
    from gyre.engines.models.tiny import TinyModelSpec, build_tokenizer

    return build_tokenizer(TinyModelSpec().vocab_size)


def _output_ids(tokenizer) -> list[int]:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return tokenizer("The tests pass.", add_special_tokens=False)["input_ids"] + [end]


def _serve(conn, build_processes: int = 0, gc_threshold: int | None = GC_THRESHOLD0) -> None:
    """Child process: the proxy in front of a NullEngine; sends (port, keys), then serves, its collector set as
    `gyre proxy serve` sets it (`gc_tuning.serving_gc`)."""
    from gyre.engines.models.hf import stop_token_ids
    from gyre.net.server_thread import ServerThread
    from gyre.proxy.app import create_app
    from gyre.proxy.router import EngineRouter
    from gyre.proxy.sessions import SessionRegistry

    tokenizer = _tokenizer()
    sessions = SessionRegistry()
    router = EngineRouter([NullEngine(_output_ids(tokenizer))])
    app = create_app(router, sessions, tokenizer, model_name="null", stop_token_ids=stop_token_ids(tokenizer),
                     build_processes=build_processes)
    keys = [sessions.mint(f"bench-{i}") for i in range(NUM_EXECUTIONS)]
    with serving_gc(gc_threshold):
        server = ServerThread(app).start()
        conn.send((server.port, keys))
        conn.recv()  # parent says stop
        server.stop()
    if app.state.core.builds is not None:
        app.state.core.builds.close()


def _bodies(keys: list[str], api: str) -> list[bytes]:
    messages = [{"role": "user", "content": "Create calc.py with add(a, b). Then run the tests."}]
    if api == "openai":
        path, auth = "/v1/chat/completions", "Authorization: Bearer {key}"
        payload = orjson.dumps({"model": "null", "max_tokens": 16,
                                "messages": [{"role": "system", "content": "You are a coding agent."}, *messages]})
    else:
        path, auth = "/v1/messages", "x-api-key: {key}"
        payload = orjson.dumps({"model": "null", "max_tokens": 16, "system": "You are a coding agent.",
                                "messages": messages})
    return [
        (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         f"{auth.format(key=key)}\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
        for key in keys
    ]


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> None:
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"proxy answered {head[:60]!r}")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    await reader.readexactly(length)


async def _latencies(port: int, bodies: list[bytes], n: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await _request(reader, writer, bodies[i % len(bodies)])
        out.append(time.perf_counter() - t0)
    writer.close()
    return out


async def _throughput(port: int, bodies: list[bytes], concurrency: int, duration_s: float) -> float:
    deadline = time.perf_counter() + duration_s
    done = 0

    async def worker(k: int) -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        i = k
        while time.perf_counter() < deadline:
            await _request(reader, writer, bodies[i % len(bodies)])
            done += 1
            i += concurrency
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return done / (time.perf_counter() - start)


def _direct_s(tokenizer, n: int) -> float:
    engine = NullEngine(_output_ids(tokenizer))
    request = GenerationRequest(tokenizer("x", add_special_tokens=False)["input_ids"], SamplingParams())
    t0 = time.perf_counter()
    for _ in range(n):
        engine.generate(request)
    return (time.perf_counter() - t0) / n


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


@contextmanager
def null_proxy() -> Iterator[tuple[int, list[str]]]:
    """The proxy in front of a `NullEngine` in a child process: (port, one key per execution)."""
    with null_proxy_process() as (port, keys, _):
        yield port, keys


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` and its live children have used (all their threads), from
    /proc: a proxy's build workers (`gyre.proxy.build_processes`) are part of the proxy."""
    total = _stat_cpu_s(Path(f"/proc/{pid}/stat"))
    for child in _children(pid):
        try:
            total += _stat_cpu_s(Path(f"/proc/{child}/stat"))
        except FileNotFoundError:  # it ended since the listing
            continue
    return total


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:  # the thread ended since the listing
            continue
    return out


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each live thread of process `pid` (thread id -> seconds)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = _stat_cpu_s(task / "stat")
        except FileNotFoundError:  # the thread ended since the listing
            continue
    return out


def _stat_cpu_s(stat: Path) -> float:
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * CLOCK_TICK_S


@contextmanager
def null_proxy_process(build_processes: int = 0,
                       gc_threshold: int | None = GC_THRESHOLD0) -> Iterator[tuple[int, list[str], int]]:
    """`null_proxy`, with the child's pid (to read its CPU time, its build workers' included: `cpu_seconds`).
    `build_processes`: the proxy's prompt-build worker processes (0: builds in the proxy's process);
    `gc_threshold`: its collector's young threshold while serving (None: Python's own settings)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, build_processes, gc_threshold), daemon=True)
    proc.start()
    try:
        for _ in range(int(START_TIMEOUT_S / START_POLL_S)):
            if parent.poll(START_POLL_S):
                break
            if not proc.is_alive():  # it failed to start: its traceback is on stderr above
                raise RuntimeError(f"proxy benchmark server exited with code {proc.exitcode} before it served")
        else:
            raise TimeoutError(f"proxy benchmark server did not start within {START_TIMEOUT_S:g} s")
        port, keys = parent.recv()
        yield port, keys, proc.pid
    finally:
        parent.send("stop")
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()


def run(duration_s: float = DEFAULT_DURATION_S, concurrency: int = DEFAULT_CONCURRENCY) -> dict:
    """Serve, measure, stop. Returns the numbers (milliseconds, requests per second)."""
    with null_proxy() as (port, keys):
        direct_ms = _direct_s(_tokenizer(), 10000) * 1e3
        load_before = os.getloadavg()[0]
        result: dict = {"direct_engine_ms": round(direct_ms, 4)}
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            runner = asyncio.run
        for api in ("openai", "anthropic"):
            bodies = _bodies(keys, api)
            runner(_latencies(port, bodies, WARMUP_REQUESTS))
            lat_ms = [x * 1e3 - direct_ms for x in runner(_latencies(port, bodies, LATENCY_REQUESTS))]
            rps = runner(_throughput(port, bodies, concurrency, duration_s))
            prefix = "" if api == "openai" else "anthropic_"
            result[f"{prefix}p50_overhead_ms"] = round(statistics.median(lat_ms), 3)
            result[f"{prefix}p99_overhead_ms"] = round(_quantile(lat_ms, 0.99), 3)
            result[f"{prefix}requests_per_s"] = round(rps, 1)
        result["load_avg_1m_before"] = round(load_before, 2)
        result["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
        result["cpu_count"] = os.cpu_count()
        result["concurrency"] = concurrency
        result["targets"] = TARGETS
        result["meets_targets"] = (
            result["p50_overhead_ms"] <= TARGETS["p50_overhead_ms"]
            and result["p99_overhead_ms"] <= TARGETS["p99_overhead_ms"]
            and result["requests_per_s"] >= TARGETS["requests_per_s"]
        )
        return result
