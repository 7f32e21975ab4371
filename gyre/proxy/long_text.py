"""Long texts are tokenised in a helper process, so a huge prompt never competes with the
proxy's event loop for the GIL or, on a busy box, for the CPU.

Tokenising is the costly part of prompt work: a prompt near the context's character bound
(`limits.py`) of a small vocabulary is ~10^5 tokens, about half a second of CPU. In a
worker thread of the proxy (the GIL released, `escape.py`) that CPU is still taken at the
priority of the event loop, and lowering the thread's priority is worse: a low-priority
thread descheduled while it holds the GIL stops the loop with it (priority inversion). So
texts of at least `LONG_TEXT_CHARS` characters go to a `LongTextTokenizer`: a spawned
helper process holding its own copy of the Rust tokenizer, built from the same JSON (same
ids), running `HELPER_NICE` steps nicer than the proxy. The OS hands the proxy's threads a
core first, and nothing the helper does holds the proxy's GIL; the calling worker thread
waits with the GIL released and gets the ids back as a packed array.

The helper starts on first use (a proxy that never sees a long text never starts one) and
exits within `PARENT_CHECK_S` of the proxy's death, however the proxy ended (kill -9
included). If the helper dies (killed, out of memory) the pool is replaced once for the
call that found it dead; a second failure is the caller's error.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from array import array
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

LONG_TEXT_CHARS = 32_768
"""Texts at least this long are tokenised in the helper (shorter ones cost less than the hop)."""
HELPER_PROCESSES = 1
"""Helper processes per tokenizer; long texts beyond that queue (the lanes bound them anyway)."""
HELPER_NICE = 10
"""Niceness the helper adds to the proxy's."""
PARENT_CHECK_S = 1.0
"""How often the helper checks that the proxy that started it still runs."""

_helper_tokenizers: dict[bool, object] = {}
"""In the helper: special-token parsing on (True) or off (False) -> its Rust tokenizer."""


def _start_helper(tokenizer_json: str, nice: int, proxy_pid: int) -> None:
    from tokenizers import Tokenizer

    os.nice(nice)
    threading.Thread(target=_exit_with, args=(proxy_pid,), name="exit-with-proxy", daemon=True).start()
    _helper_tokenizers[True] = Tokenizer.from_str(tokenizer_json)
    plain = Tokenizer.from_str(tokenizer_json)
    plain.encode_special_tokens = True  # control-token text is plain text here
    _helper_tokenizers[False] = plain


def _exit_with(proxy_pid: int) -> None:
    """In the helper: exit once the proxy is gone (this process was handed to another parent)."""
    while os.getppid() == proxy_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _encode(text: str, special: bool) -> bytes:
    ids = _helper_tokenizers[special].encode_batch_fast([text], add_special_tokens=False)[0].ids  # no offsets
    return array("i", ids).tobytes()


class LongTextTokenizer:
    def __init__(self, tokenizer_json: str, processes: int = HELPER_PROCESSES, nice: int = HELPER_NICE) -> None:
        self._json, self._processes, self._nice = tokenizer_json, processes, nice
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def encode(self, text: str, special: bool) -> list[int]:
        """Token ids of `text` (control tokens parsed when `special`); blocks, GIL released."""
        pool = self._running()
        try:
            packed = pool.submit(_encode, text, special).result()
        except BrokenProcessPool:  # the helper died: start another, once
            packed = self._running(replace=pool).submit(_encode, text, special).result()
        ids = array("i")
        ids.frombytes(packed)
        return ids.tolist()

    def _running(self, replace: ProcessPoolExecutor | None = None) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None or self._pool is replace:
                if replace is not None:
                    replace.shutdown(wait=False)
                self._pool = ProcessPoolExecutor(
                    self._processes, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_helper, initargs=(self._json, self._nice, os.getpid()),
                )
            return self._pool
