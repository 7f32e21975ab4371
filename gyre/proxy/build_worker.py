"""A prompt-build worker process: the TITO build and remember of the executions sharded to it.

Started by `build_processes.BuildProcesses` as `python -m gyre.proxy.build_worker FD`, FD being
its end of a socket pair. Frames both ways are a 4-byte little-endian length and a pickle. The
first frame is the pickled tokenizer; then requests, served in order (so a turn remembered is
remembered before the same execution's next build, which the proxy sends after it):

- `("build", execution_id, handle, keep, new_messages, tools, same_tools)`: the conversation is
  the first `keep` messages of the execution's last one plus `new_messages` (the proxy sends only
  what changed); answered `("ok", base, literal, num_messages, spliced, fallback_turns, spans)`,
  the prompt's ids being those of the earlier prompt `base` (a handle, None for none) followed by
  `literal` (packed int32), or `("error", message)` when the chat template rejects it;
- `("remember", execution_id, handle, assistant, output_ids, ended)`: not answered;
- `("close", execution_id)`: the execution ended; its state is dropped. Not answered.

The worker exits when the proxy's end of the socket closes (the proxy ended, however it ended).
"""

from __future__ import annotations

import logging
import pickle
import socket
import struct
import sys
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gyre.proxy.prompt import BuiltPrompt, PromptBuilder, TitoCache

HEADER = struct.Struct("<I")
KEEP_PROMPTS = 4
"""Built prompts kept per execution for a later remember (a call aborted is never remembered:
its prompt is dropped when newer ones push it out). The proxy keeps twice as many ids lists."""


@dataclass
class ExecutionState:
    tito: TitoCache = field(default_factory=TitoCache)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    prompts: OrderedDict[int, BuiltPrompt] = field(default_factory=OrderedDict)
    handle_of: dict[int, int] = field(default_factory=dict)
    """id() of a kept prompt's ids list -> its handle (a prefix state's head is such a list)."""


class Worker:
    def __init__(self, builder: PromptBuilder) -> None:
        self.builder = builder
        self.executions: dict[str, ExecutionState] = {}

    def build(self, execution_id: str, handle: int, keep: int, new_messages: list, tools, same_tools: bool) -> tuple:
        state = self.executions.setdefault(execution_id, ExecutionState())
        state.messages = state.messages[:keep] + new_messages
        if not same_tools:
            state.tools = tools
        try:
            prompt = self.builder.build(state.messages, state.tools, state.tito)
        except Exception as exc:  # the chat template rejected the conversation: the caller's 400
            return ("error", str(exc))
        base, base_len = None, 0
        if prompt.base is not None:  # the prefix state it started from: an earlier prompt's ids, then more
            base = state.handle_of.get(id(prompt.base.head_ids))
            base_len = len(prompt.base.head_ids) if base is not None else 0
        state.prompts[handle] = prompt
        state.handle_of[id(prompt.ids)] = handle
        while len(state.prompts) > KEEP_PROMPTS:
            _, old = state.prompts.popitem(last=False)
            state.handle_of.pop(id(old.ids), None)
        literal = array("i", prompt.ids[base_len:] if base_len else prompt.ids).tobytes()
        return ("ok", base, literal, prompt.num_messages, prompt.spliced_turns, prompt.fallback_turns,
                prompt.fallback_spans)

    def remember(self, execution_id: str, handle: int, assistant: dict, output_ids: bytes, ended: bool) -> None:
        state = self.executions.get(execution_id)
        prompt = state.prompts.get(handle) if state is not None else None
        if prompt is None:  # pushed out by newer prompts of the execution: its turn falls back, counted
            return
        ids = array("i")
        ids.frombytes(output_ids)
        state.tito.defer(lambda: self.builder.remember(state.tito, prompt, assistant, ids.tolist(), ended))
        state.tito.settle()

    def close(self, execution_id: str) -> None:
        self.executions.pop(execution_id, None)


def read_frame(sock: socket.socket) -> bytes | None:
    head = _read_exactly(sock, HEADER.size)
    return None if head is None else _read_exactly(sock, HEADER.unpack(head)[0])


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def serve(sock: socket.socket) -> None:
    first = read_frame(sock)
    if first is None:
        return
    worker = Worker(PromptBuilder(pickle.loads(first)))
    while (data := read_frame(sock)) is not None:
        op, *args = pickle.loads(data)
        if op == "build":
            sock.sendall(frame(worker.build(*args)))
        elif op == "remember":
            worker.remember(*args)
        elif op == "close":
            worker.close(*args)
        else:
            raise ValueError(f"build worker: unknown request {op!r}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    serve(socket.socket(fileno=int(sys.argv[1])))
