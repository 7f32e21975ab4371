"""Prompt work off the event loop, in two bounded lanes of worker threads.

The proxy's event loop moves bytes: it reads bodies, routes, streams tokens, answers
`/health`. Templating a conversation and tokenising it, and after the engine answers,
decoding and parsing a long output and rendering the turn to remember it for splicing
(`completion.py`), cost time linear in the prompt or output, so they do not run on the loop
while other calls need it: `PromptLanes.run` hands them to a worker thread and awaits the
result. Two exceptions, where the hop would cost more than the work: a short output is
finished on the loop (`completion.INLINE_FINISH_TOKENS`), and a call alone in the proxy whose
new text is short is built there (`completion.INLINE_BUILD_CHARS`).
Remembering the turn is not on the call's path at all: `PromptLanes.submit` runs it once
the answer is out (the execution's next build runs it first if it comes before,
`prompt.TitoCache.settle`).

Two lanes, chosen by the prompt's size in characters (`limits.counted_chars`, known
before any of that work): prompts under `HEAVY_PROMPT_CHARS` (most calls; TITO prefix
states make even a long conversation's next call cheap) run in `LIGHT_WORKERS` threads,
larger ones in `HEAVY_WORKERS` threads. A burst of huge requests therefore queues behind
itself, never in front of the small requests of other executions.

Worker threads share the GIL with the loop. Rendering is Python and yields it every
switch interval (5 ms); tokenising releases it (`escape.py`), and a long text is
tokenised in a nicer helper process (`long_text.py`), so the loop keeps answering, and
keeps its CPU, while a huge prompt is being tokenised. The threads themselves run at the
loop's priority: a nicer thread descheduled while it holds the GIL would stall the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

HEAVY_PROMPT_CHARS = 65_536
"""Prompts with at least this many counted characters (~16k tokens) take the heavy lane."""
LIGHT_WORKERS = 4
"""Threads doing the prompt work of ordinary requests."""
HEAVY_WORKERS = 2
"""Threads doing the prompt work of heavy requests."""


class PromptLanes:
    def __init__(self, light_workers: int = LIGHT_WORKERS, heavy_workers: int = HEAVY_WORKERS,
                 heavy_chars: int = HEAVY_PROMPT_CHARS) -> None:
        self.heavy_chars = heavy_chars
        self._light = ThreadPoolExecutor(light_workers, thread_name_prefix="gyre-prompt")
        self._heavy = ThreadPoolExecutor(heavy_workers, thread_name_prefix="gyre-prompt-heavy")

    async def run(self, chars: int, fn: Callable[..., T], *args) -> T:
        """`fn(*args)` in the lane for a prompt of `chars` characters."""
        return await asyncio.get_running_loop().run_in_executor(self._lane(chars), fn, *args)

    def submit(self, chars: int, fn: Callable[..., object], *args) -> None:
        """`fn(*args)` in the lane for a prompt of `chars` characters, not waited for: work off a
        call's path (its error is logged; whoever needs the work's result runs it again)."""
        self._lane(chars).submit(fn, *args).add_done_callback(_log_error)

    def _lane(self, chars: int) -> ThreadPoolExecutor:
        return self._heavy if chars >= self.heavy_chars else self._light


def _log_error(future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("proxy: background prompt work failed", exc_info=future.exception())
