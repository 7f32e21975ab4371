"""Call records on disk as they are made, not when a step or a server ends.

The proxy records a `Call` before it answers. Held in memory until a step was recorded (a
run) or the server stopped (`gyre proxy serve`), those records died with the process. A
`CallLog` takes each call the moment the proxy records it (it is the `SessionRegistry`'s
sink) and a background thread appends what has accumulated to the `RunStore` every
`FLUSH_INTERVAL_S`: one batch per table in one transaction (`RunStore.append_calls`),
never row by row. So:

- a process killed outright (kill -9, OOM) loses at most the calls answered in its last
  flush interval, well under a second; DuckDB replays its write-ahead log on the next open;
- a process that stops in order calls `close`, which writes the rest: nothing is lost.

`flush()` writes everything handed over so far and returns once it is committed; the
coordinator calls it before it appends a step's row, so a step's calls are on disk first.

A failed append is not swallowed: the background thread stops, and the next `put`, `flush`
or `close` raises, so the proxy answers calls it can no longer keep with an error instead
of serving them unrecorded.

Thread-safe: `put` is called from the proxy's event loop and worker threads, `flush` from
the coordinator, the background thread writes; batches are committed in the order their
calls were handed over.
"""

from __future__ import annotations

import logging
import threading

from gyre.records import Call
from gyre.storage.store import RunStore

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.25
"""How often pending calls are appended. Well under the one second a hard kill may lose, so
a slow append on a loaded box still fits in that second."""


class CallLogError(RuntimeError):
    """Calls cannot be kept: appending them to the run store failed, or the log was closed."""


class CallLog:
    def __init__(self, store: RunStore, flush_interval_s: float = FLUSH_INTERVAL_S,
                 run_id: str | None = None) -> None:
        """`run_id`: the start of the run whose calls these are (each `calls` row carries it)."""
        self.store = store
        self.run_id = run_id
        self._interval_s = flush_interval_s
        self._pending: list[Call] = []
        self._lock = threading.Lock()  # guards _pending, _error and _closed
        self._write_lock = threading.Lock()  # one append at a time, so batches commit in order
        self._error: BaseException | None = None
        self._closed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gyre-call-log", daemon=True)
        self._thread.start()

    def put(self, call: Call) -> None:
        """Hand over one recorded call; it is on disk within `FLUSH_INTERVAL_S` (plus the append)."""
        with self._lock:
            self._check()
            if self._closed:
                raise CallLogError(f"call {call.call_id} recorded after the call log of {self.store.path} closed")
            self._pending.append(call)

    def flush(self) -> int:
        """Append every call handed over so far; returns once committed, with how many it wrote."""
        with self._write_lock:
            with self._lock:
                self._check()
                batch, self._pending = self._pending, []
            if not batch:
                return 0
            try:
                return self.store.append_calls(batch, self.run_id)
            except BaseException as exc:
                with self._lock:
                    self._error = exc
                raise

    def close(self) -> None:
        """Stop the background thread and write what is left; a later `put` raises."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            self._closed = True
        self.flush()

    def _check(self) -> None:
        if self._error is not None:
            raise CallLogError(f"appending calls to {self.store.path} failed: {self._error!r}") from self._error

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.flush()
            except BaseException:  # surfaced to the next put/flush/close; nothing more can be kept
                log.exception("call log: appending calls to %s failed", self.store.path)
                return
