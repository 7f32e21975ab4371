"""Nothing a run starts outlives it: stop signals, leftover processes, the coordinator's closers.

Prefect's API server, which gyre starts itself so that it dies with the run even after a
kill -9, lives with the flows (`gyre.flows.prefect_server`).

Everything else a run starts already dies with it: sandbox commands and sessions run under
bubblewrap's `--die-with-parent` (its PID namespace ends with it), the long-text tokenizer
helper exits once its parent is gone (`gyre.proxy.long_text`), engines and the proxy are
threads. Without bubblewrap, sandbox commands are plain process groups and a kill -9 of
gyre leaves a still-running command behind until its own timeout would have ended it (the
gap `gyre.sandboxes.process` names).

Stop signals (`StopOnSignal`): the run's flow runs in a worker thread, so Prefect's own
SIGTERM bridge is not installed (it needs the main thread) and the main thread keeps gyre's
handlers. On the first SIGTERM or SIGINT gyre abandons the current step (a resumed run
reruns it), runs the registered closers (`on_stop`: the coordinator's close, which flushes
the call log, closes kept sandboxes, the proxy, the engines and the DuckDB file), kills
every process below it, stops the Prefect server and exits 128 + the signal's number,
with one line on stderr. While the closers run, the flow's thread starts nothing new: at its next
`hold_if_stopping` (before each task submission and record) it waits for the process to end, so no
task run is created after the closers have cancelled the open ones and no step is recorded after the
run was marked stopped. Before the closers, the work already in flight (task runs the flow
`track`ed, the flow's own thread until it parks) gets `STOP_DRAIN_S` to end on its own (`drain`): an
optimizer step or a record under way finishes and its rows are kept, instead of meeting a closed file.
Closers get `STOP_GRACE_S`; a second signal, or the grace running out, ends the process at once (after
killing its children): the data on disk is then what a kill -9 leaves, which a resume handles.

A run stopped through Prefect (a worker's run cancelled or suspended: Prefect raises in the flow's own
thread) stops the same way from the flow (`begin_stop`, then `drain`). Either way `stopping()` is
then true, and a task that starts, or fails because what it used was closed, ends Cancelled
(`gyre.tasks.step`): a stop is never reported as a failure or a crash.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

STOP_GRACE_S = 20.0
"""How long the closers of a stopping run may take before the process ends regardless."""
STOP_DRAIN_S = 5.0
"""How long work already in flight may take to end on its own once a run is stopping (within the grace)."""
_closers: list[Callable[[], None]] = []
_closers_lock = threading.Lock()
_stopping = threading.Event()
_parked = threading.Event()
"""Set once the run's flow thread waits in `hold_if_stopping`: it starts and records nothing more."""
_in_flight: set = set()
_in_flight_lock = threading.Lock()


class RunStopped(Exception):
    """Raised by long work that checks `stopping()` (the warm start, each optimizer step of it)."""


def begin_run() -> None:
    """A run starts in this process: nothing is stopping, nothing is in flight (a process runs one run)."""
    _stopping.clear()
    _parked.clear()
    with _in_flight_lock:
        _in_flight.clear()


def begin_stop() -> None:
    """The run is stopping (a stop signal, or Prefect cancelling or suspending it): see the module docstring."""
    _stopping.set()


def stopping() -> bool:
    """Whether the run of this process is stopping."""
    return _stopping.is_set()


def track(future):
    """Note a task run's future as work in flight until it ends (`drain` waits for it); returns it."""
    with _in_flight_lock:
        _in_flight.add(future)
    future.add_done_callback(_untrack)
    return future


def _untrack(future) -> None:
    with _in_flight_lock:
        _in_flight.discard(future)


def drain(timeout_s: float = STOP_DRAIN_S) -> int:
    """Wait, at most `timeout_s`, for the tracked work in flight to end and, in a run whose flow has its own
    thread, for that thread to park (`hold_if_stopping`); returns how many tracked futures are still running."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        with _in_flight_lock:
            running = len(_in_flight)  # a future leaves the set when it ends (`track`'s callback)
        idle = not running and (_parked.is_set() or not _flow_thread_busy())
        left = deadline - time.monotonic()
        if idle or left <= 0:
            return running
        time.sleep(min(0.1, left))


def _flow_thread_busy() -> bool:
    """Whether a run's flow runs in a thread of its own (`gyre run`) that has not parked yet."""
    return any(t.name == FLOW_THREAD_NAME and t.is_alive() for t in threading.enumerate())


FLOW_THREAD_NAME = "gyre-rl-run"
"""The name of the thread `gyre run` runs its flow in (the main thread keeps the signal handlers)."""


def on_stop(closer: Callable[[], None]) -> Callable[[], None]:
    """Run `closer` when a stop signal ends the run; returns the function that unregisters it."""
    with _closers_lock:
        _closers.append(closer)

    def unregister() -> None:
        with _closers_lock:
            if closer in _closers:
                _closers.remove(closer)

    return unregister


def hold_if_stopping() -> None:
    """Called by the run's flow before it starts new work (task runs, records): once a stop signal is
    being handled, any thread but the main one (where the closers run) waits here until the process ends."""
    if _stopping.is_set() and threading.current_thread() is not threading.main_thread():
        if threading.current_thread().name == FLOW_THREAD_NAME:
            _parked.set()
        threading.Event().wait()


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (by parent links in /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> None:
    """SIGKILL every process below this one (sandboxes, helpers, the Prefect server)."""
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class StopOnSignal:
    """SIGTERM/SIGINT handlers for the main thread of `gyre run` (see the module docstring)."""

    def __init__(self, server, message: Callable[[int], str]) -> None:
        """`server`: the run's Prefect server (`gyre.flows.prefect_server.PrefectServer`), killed with
        the other children on a stop, or None."""
        self.server = server
        self.message = message
        self._stopping = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if self._stopping:  # a second signal: stop now
            self._exit(signum)
        self._stopping = True
        _stopping.set()  # the flow thread starts nothing new from here (`hold_if_stopping`)
        print(self.message(signum), file=sys.stderr, flush=True)
        timer = threading.Timer(STOP_GRACE_S, self._exit, args=(signum,))
        timer.daemon = True
        timer.start()
        drain(STOP_DRAIN_S)  # work in flight ends on its own first: its rows are kept
        with _closers_lock:
            closers = list(reversed(_closers))
        for closer in closers:
            try:
                closer()
            except Exception as exc:  # deliberate: the rest must still close and the process end
                print(f"gyre run: while stopping: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        self._exit(signum)

    def _exit(self, signum: int) -> None:
        kill_descendants()
        if self.server is not None:
            self.server.process = None  # killed above with the other children
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)


LIVE_COPY_AFTER = ("run_started", "step_finished", "eval_finished")
"""Progress events after which `RUN_DIR/live.duckdb` is refreshed (each follows a committed batch)."""


def attach(coord) -> Callable[[], None]:
    """Tie a run's coordinator to this process's lifecycle: a stop signal closes it in order,
    and `RUN_DIR/live.duckdb` is refreshed after every step and evaluation round
    (`gyre.storage.live_export`). Returns the function that undoes both (call it before closing)."""
    from gyre.runtime.progress import subscribe
    from gyre.storage.live_export import LiveExport

    export = LiveExport(coord.store, coord.run_dir)

    def refresh_live_copy(event) -> None:
        if event.kind in LIVE_COPY_AFTER:
            export.write()

    undo = [on_stop(coord.close), subscribe(refresh_live_copy)]

    def detach() -> None:
        for fn in undo:
            fn()

    return detach
