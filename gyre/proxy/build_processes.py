"""Prompt builds in worker processes, so that many concurrent executions use the box's cores.

In one process every call's Python (HTTP, validation, templating, splicing, recording) shares
one GIL: tokenising releases it (`escape.py`), the rest does not. At 32 agent-shaped sessions on
2 cores that held the proxy to ~1.6 cores with no thread near a core (`gyre bench proxy-echo`,
docs/benches.md): the GIL, not a thread, bounded it. With `build_processes` > 0 the TITO build
(escape, render, splice, tokenise) and the turn's remember run in that many worker processes
(`build_worker.py`), each execution on one of them (the one with the fewest executions when it is
first seen), where its splice memory lives; the proxy's own process keeps HTTP, validation,
generation and recording.

What crosses the socket is kept small: a build sends only the messages that differ from the
execution's previous request (most of a conversation is the same objects as last time, from
`message_cache.py`), and its answer names the earlier prompt its ids start with plus the ids
after it: the proxy already holds that earlier prompt's ids (`ExecutionBuilds.ids`), so a
~50k-token prompt comes back as the few thousand new ids.

A worker that dies (killed, out of memory) fails the builds waiting on it with a 503; the next
build on that worker's slot starts a new one, which knows nothing of earlier turns: those executions'
returned turns are then template tokens, counted as fallbacks (never passed off as sampled).
A worker exits when the proxy's end of its socket closes.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import subprocess
import sys
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from gyre.proxy.build_worker import HEADER, KEEP_PROMPTS, frame
from gyre.proxy.errors import ProxyError
from gyre.proxy.message_cache import common_prefix
from gyre.proxy.prompt import BuiltPrompt

KEEP_IDS = 2 * KEEP_PROMPTS
"""Prompts' ids kept per execution here; a worker names only its last `KEEP_PROMPTS` as a base."""
STOP_WAIT_S = 5.0
"""How long `close` waits for each worker to exit after its socket closed, before killing it."""


@dataclass
class ExecutionBuilds:
    """The proxy's side of one execution's remote builds (kept on its `ExecutionSession`)."""

    generation: int = -1  # the worker generation this state is for; another one knows none of it
    messages: list[dict[str, Any]] = field(default_factory=list)  # as last sent
    tools: list[dict[str, Any]] | None = None
    ids: OrderedDict[int, list[int]] = field(default_factory=OrderedDict)  # handle -> prompt ids
    next_handle: int = 0  # never reused, across workers too


@dataclass
class _Pending:
    future: asyncio.Future
    state: ExecutionBuilds
    handle: int


@dataclass
class _Shard:
    index: int
    generation: int
    process: subprocess.Popen
    socket: socket.socket
    writer: asyncio.StreamWriter
    pending: deque[_Pending] = field(default_factory=deque)
    dead: bool = False


class BuildProcesses:
    def __init__(self, tokenizer, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"build processes: at least 1 (got {processes}); 0 builds in the proxy's process")
        self._tokenizer = frame(tokenizer)  # pickled once, sent to every worker as its first frame
        self._shards: list[_Shard | None] = [None] * processes
        self._spawned = [_spawn() for _ in range(processes)]  # importing while the proxy starts
        self._starting: dict[int, asyncio.Task] = {}
        self._assigned: dict[str, int] = {}  # execution id -> its worker (on the event loop only)
        self._executions = [0] * processes  # executions assigned to each worker
        self._generations = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def _index(self, execution_id: str) -> int:
        """The execution's worker: the one with the fewest executions when it is first seen (a hash split
        32 executions 19 / 13 and the busier worker bounded the proxy), then always that one."""
        index = self._assigned.get(execution_id)
        if index is None:
            index = self._assigned[execution_id] = min(range(len(self._shards)), key=self._executions.__getitem__)
            self._executions[index] += 1
        return index

    async def build(self, session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> BuiltPrompt:
        """The execution's TITO prompt for `messages`, built by its worker."""
        shard = await self._shard(self._index(session.execution_id))
        state = session.builds
        if state is None or state.generation != shard.generation:  # new here, or its worker was replaced
            handle = state.next_handle if state is not None else 0
            state = session.builds = ExecutionBuilds(generation=shard.generation, next_handle=handle)
        keep = common_prefix(messages, state.messages)  # the worker has these already
        same_tools = tools is state.tools or tools == state.tools
        state.messages, state.tools = messages, tools
        handle = state.next_handle
        state.next_handle += 1
        future = asyncio.get_running_loop().create_future()
        shard.pending.append(_Pending(future, state, handle))
        shard.writer.write(frame(("build", session.execution_id, handle, keep, messages[keep:],
                                  None if same_tools else tools, same_tools)))
        return await future

    def remember(self, session, prompt: BuiltPrompt, assistant: dict[str, Any], output_ids: list[int],
                 ended: bool) -> None:
        """Remember the returned turn in the execution's worker: sent now from the event loop, or from a
        worker thread queued to the loop ahead of the call's result (either way before the execution's
        next build)."""
        request = frame(("remember", session.execution_id, prompt.handle, assistant,
                         array("i", output_ids).tobytes(), ended))
        if _running_loop() is self._loop:
            self._send_remember(session, request)
        else:
            self._loop.call_soon_threadsafe(self._send_remember, session, request)

    def _send_remember(self, session, request: bytes) -> None:
        index = self._assigned.get(session.execution_id)
        shard = self._shards[index] if index is not None else None  # None: the execution was closed meanwhile
        state = session.builds
        if shard is not None and not shard.dead and state is not None and state.generation == shard.generation:
            shard.writer.write(request)

    def forget(self, execution_id: str) -> None:
        """The execution ended: its worker drops its splice memory. From any thread."""
        if self._loop is not None and not self._loop.is_closed():  # a closed loop's workers saw their end
            self._loop.call_soon_threadsafe(self._send_close, execution_id)

    def _send_close(self, execution_id: str) -> None:
        index = self._assigned.pop(execution_id, None)
        if index is None:  # never built here
            return
        self._executions[index] -= 1
        shard = self._shards[index]
        if shard is not None and not shard.dead:
            shard.writer.write(frame(("close", execution_id)))

    def close(self) -> None:
        """Stop every worker: its socket is shut (it exits on the end of input) and it is waited for,
        killed after `STOP_WAIT_S`. From any thread; builds still waiting fail with a 503."""
        shards, self._shards = self._shards, [None] * len(self._shards)
        spawned, self._spawned = self._spawned, [None] * len(self._spawned)
        workers = [(s.socket, s.process) for s in shards if s is not None] + [w for w in spawned if w is not None]
        for sock, _ in workers:
            if sock.fileno() != -1:  # else the server's loop closed it already: the worker saw the end
                sock.shutdown(socket.SHUT_RDWR)
        for _, process in workers:
            _reap(process)

    # -- workers ----------------------------------------------------------------------------

    async def _shard(self, index: int) -> _Shard:
        shard = self._shards[index]
        if shard is not None and not shard.dead:
            return shard
        task = self._starting.get(index)
        if task is None:
            task = self._starting[index] = asyncio.ensure_future(self._start(index))
            task.add_done_callback(lambda _: self._starting.pop(index, None))
        return await task

    async def _start(self, index: int) -> _Shard:
        self._loop = asyncio.get_running_loop()
        spawned, self._spawned[index] = self._spawned[index], None
        ours, process = spawned or _spawn()  # a worker started with the proxy, or a replacement
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        writer.write(self._tokenizer)
        self._generations += 1
        shard = self._shards[index] = _Shard(index, self._generations, process, ours, writer)
        asyncio.ensure_future(self._read(shard, reader))
        return shard

    async def _read(self, shard: _Shard, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                size = HEADER.unpack(await reader.readexactly(HEADER.size))[0]
                pending = shard.pending.popleft()
                try:
                    self._answer(pending, pickle.loads(await reader.readexactly(size)))
                except Exception as exc:  # a bad answer fails its own call, never the ones behind it
                    if not pending.future.done():
                        pending.future.set_exception(exc)
        except (asyncio.IncompleteReadError, ConnectionError):
            shard.dead = True
            code = shard.process.poll()
            for pending in shard.pending:
                if not pending.future.done():
                    pending.future.set_exception(ProxyError(
                        503, f"prompt build worker {shard.index} exited (code {code}) during the build; retry",
                        "overloaded"))
            shard.pending.clear()

    @staticmethod
    def _answer(pending: _Pending, reply: tuple) -> None:
        """Store the prompt's ids (even if its caller went away: a later prompt may start with them)."""
        if reply[0] == "error":
            if not pending.future.done():
                pending.future.set_exception(
                    ProxyError(400, f"cannot render messages with the chat template: {reply[1]}"))
            return
        _, base, literal, num_messages, spliced, fallback_turns, spans = reply
        rest = array("i")
        rest.frombytes(literal)
        state = pending.state
        ids = state.ids[base] + rest.tolist() if base is not None else rest.tolist()
        state.ids[pending.handle] = ids
        while len(state.ids) > KEEP_IDS:
            state.ids.popitem(last=False)
        if not pending.future.done():
            pending.future.set_result(BuiltPrompt(
                ids=ids, text="", num_messages=num_messages, spliced_turns=spliced, fallback_turns=fallback_turns,
                fallback_spans=spans, handle=pending.handle))


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # a worker thread
        return None


def _spawn() -> tuple[socket.socket, subprocess.Popen]:
    """A worker process and the proxy's end of its socket."""
    ours, theirs = socket.socketpair()
    process = subprocess.Popen([sys.executable, "-m", "gyre.proxy.build_worker", str(theirs.fileno())],
                               pass_fds=(theirs.fileno(),))
    theirs.close()
    return ours, process


def _reap(process: subprocess.Popen) -> None:
    try:
        process.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
