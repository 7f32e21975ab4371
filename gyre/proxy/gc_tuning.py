"""The serving process's garbage collector, set for what a proxy keeps alive.

A proxy holds every live execution's conversation: its messages (validated once, `message_cache.py`) and the
token ids of its prompts (lists of ~50k ints each, `prompt.py`), and each call allocates more of the same.
CPython's cyclic collector runs a young collection every 700 net container allocations and
traverses every container it tracks, a list of ints item by item; a call allocates many containers, so the young
collections came every few calls, each traversing that call's new 50k-id lists, and the occasional full
collection traversed every execution's. At 32 agent-shaped sessions (`gyre bench proxy-echo --python-gc`, 2 cores,
2026-12-07, timed by an ad-hoc `gc.callbacks` hook) the collector took ~650 ms of a ~1.9 s phase: 180 young
collections (~250 ms), 16 middle ones (~165 ms), 2 full ones (~235 ms, the longest one pause of 160 ms in every
session's call). With `serving_gc`: 22-24 % more calls a second, the p99 about halved (docs/benches.md).

`serving_gc` raises the young threshold to `GC_THRESHOLD0` (a call's short-lived lists are then mostly freed by
their reference counts before any collection sees them) and freezes what is alive when serving starts (modules,
the tokenizer, the template: never garbage, no longer traversed by a full collection). Garbage cycles are still
collected, later: a young one within `GC_THRESHOLD0` net allocations, older generations after 10 and 100 times
that, as before relative to the young. Both are undone when serving ends. The build worker processes
(`build_processes.py`) keep Python's own settings.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

GC_THRESHOLD0 = 20_000
"""Net container allocations between young collections while serving (CPython's default: 700). From
`gyre bench proxy-echo` at 32 sessions on 2 cores, one ad-hoc timed run each: 20,000 took the collector's time from
~650 ms to ~30-150 ms of the phase; 100,000 gave no more (docs/benches.md)."""


@contextmanager
def serving_gc(threshold0: int | None = GC_THRESHOLD0) -> Iterator[None]:
    """Serve inside this: the objects alive now frozen out of collections, young collections every `threshold0`
    net allocations (None: Python's own settings, nothing changed). The previous settings are restored on exit."""
    if threshold0 is None:
        yield
        return
    if threshold0 < 1:
        raise ValueError(f"gc threshold {threshold0}: must be at least 1 (0 would turn the collector off)")
    before = gc.get_threshold()
    gc.collect()  # what is garbage now is not frozen
    gc.freeze()
    gc.set_threshold(threshold0, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
