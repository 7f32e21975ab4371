"""Where one agent-shaped proxy call's time goes, stage by stage (a diagnostic, not a benchmark).

`gyre bench proxy-echo` gives a call's round trip and the time to tokenise its new text alone;
this says what lies between them. It serves the benchmark's null proxy (`gyre.benches.proxy`)
in a child process whose proxy methods are wrapped with `time.perf_counter` stamps, replays
echoing agent sessions one call at a time (`gyre.benches.proxy_echo.replay`, the bench's
sequential phase), and prints each stage's p50 and its time per call:

    .venv/bin/python scripts/proxy_stages.py [--sessions 4] [--out FILE.json]

Stages nest: `handler` (the endpoint, from its start to the response object) holds
`read_conversation` (body, JSON, message cache, validation), `core_turn` (`build_await`: the
hop to a prompt lane, none for a call alone in the proxy, and `build_thread`, the build:
`render`, `best_state`, `encode`) and `turn_run` (`generation`: router, the null engine's
future, answered while taken (`engines.base.Submits`, no thread hop); then `finish_thread`:
decode, parse and `record`). `long_text` is the part of `encode` sent to the helper process (a
text of at least `long_text.LONG_TEXT_CHARS` characters tokenised at once; not printed when no
call had one). `render` and `encode` also count the turn remembered after the answer (off the
call's path). The round trip minus `handler` is HTTP on both sides. The wrappers add a few microseconds per stage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import multiprocessing as mp
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STAGES = {  # stage -> (module, class, method)
    "handler": ("gyre.proxy.app", "Endpoints", "chat_completions"),
    "read_body": ("gyre.proxy.app", "Endpoints", "read_body"),
    "read_conversation": ("gyre.proxy.app", "Endpoints", "read_conversation"),
    "core_turn": ("gyre.proxy.completion", "CompletionCore", "turn"),
    "build_await": ("gyre.proxy.completion", "CompletionCore", "build_prompt"),
    "build_thread": ("gyre.proxy.completion", "CompletionCore", "_build"),
    "render": ("gyre.proxy.prompt", "PromptBuilder", "render"),
    "best_state": ("gyre.proxy.prompt", "TitoCache", "best_state"),
    "encode": ("gyre.proxy.escape", "ControlTokenEscaper", "encode"),
    "long_text": ("gyre.proxy.long_text", "LongTextTokenizer", "encode"),
    "turn_run": ("gyre.proxy.completion", "Turn", "_run"),
    "generation": ("gyre.proxy.generation", "Generation", "run"),
    "finish_thread": ("gyre.proxy.completion", "Turn", "_finish"),
    "record": ("gyre.proxy.completion", "Turn", "_record"),
}


def _wrap(times: dict[str, list[float]]) -> None:
    import importlib

    @contextlib.contextmanager
    def stamp(stage: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            times[stage].append(time.perf_counter() - started)

    for stage, (module, cls_name, name) in STAGES.items():
        cls = getattr(importlib.import_module(module), cls_name)
        original = getattr(cls, name)
        if asyncio.iscoroutinefunction(original):
            async def timed(*a, _f=original, _s=stage, **k):
                with stamp(_s):
                    return await _f(*a, **k)
        else:
            def timed(*a, _f=original, _s=stage, **k):
                with stamp(_s):
                    return _f(*a, **k)
        setattr(cls, name, functools.wraps(original)(timed))


def _serve(conn) -> None:
    """Child: the benchmark's null proxy with its stages timed; sends the times when told to stop."""
    from gyre.benches import proxy

    times: dict[str, list[float]] = defaultdict(list)
    _wrap(times)
    inner, outer = mp.Pipe()

    def relay() -> None:
        conn.send(inner.recv())  # (port, keys)
        conn.recv()
        conn.send(dict(times))
        inner.send("stop")

    threading.Thread(target=relay, daemon=True).start()
    proxy._serve(outer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4, help="sessions replayed one call at a time")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, help="write the numbers here as JSON")
    args = parser.parse_args()
    from gyre.benches.agent_sessions import agent_sessions
    from gyre.benches.proxy_echo import RESULT_CHARS, RawClient, replay

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child,), daemon=True)
    proc.start()
    port, keys = parent.recv()
    sessions = agent_sessions(args.sessions, 17, args.seed, api="openai", result_chars=RESULT_CHARS)
    round_trips: list[float] = []

    async def replay_all() -> None:
        for key, session in zip(keys, sessions):
            async with RawClient(port) as client:
                round_trips.extend(seconds for _, seconds in await replay(client, key, session))

    load_before = __import__("os").getloadavg()[0]
    try:  # the client's loop as in the benches
        import uvloop
    except ImportError:
        asyncio.run(replay_all())
    else:
        uvloop.run(replay_all())
    parent.send("stop")
    times = parent.recv()
    proc.join(10)
    calls = len(round_trips)
    result = {
        "calls": calls, "round_trip_p50_ms": round(statistics.median(round_trips) * 1e3, 3),
        "stages": {s: {"n": len(v), "p50_ms": round(statistics.median(v) * 1e3, 3),
                       "per_call_ms": round(sum(v) / calls * 1e3, 3)} for s, v in times.items()},
        "load_avg_1m_before": round(load_before, 2),
        "load_avg_1m_after": round(__import__("os").getloadavg()[0], 2),
    }
    print(f"{calls} calls, round trip p50 {result['round_trip_p50_ms']:.3f} ms")
    for stage in STAGES:
        if stage in result["stages"]:
            s = result["stages"][stage]
            print(f"  {stage:18s} n={s['n']:4d}  p50 {s['p50_ms']:7.3f} ms  per call {s['per_call_ms']:7.3f} ms")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
