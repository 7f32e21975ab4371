"""Nothing a run starts outlives it: the Prefect server, stop signals, leftover processes.

Why gyre starts Prefect's server itself. In ephemeral mode Prefect (3.x,
`prefect.server.api.server.SubprocessASGIServer`) starts `python -m uvicorn ...
prefect.server.api.server:create_app` with a plain `subprocess.Popen` and stops it from an
`atexit` hook. A process killed outright (kill -9, OOM) runs no `atexit`, so that server
was left running with ppid 1, holding its port, after every hard stop. `PrefectServer`
starts the same command as a child of `gyre run` whose kernel parent-death signal
(`prctl(PR_SET_PDEATHSIG, SIGKILL)`) is set before it execs uvicorn, and points
`PREFECT_API_URL` at it, so Prefect never starts its own. The signal is delivered when the
thread that forked the child ends, so the server is started from the main thread, which
lives as long as the process. It is set by a small exec wrapper (`_PDEATHSIG_EXEC`), not a
`preexec_fn` (unsafe once threads exist); the wrapper exits at once if the parent died
before the signal was armed. uvicorn gets an already bound listening socket (`--fd`), so
no port is raced for. Alternatives considered: a process group killed as a whole (gyre
would have to leave the terminal's foreground group, so Ctrl-C would no longer reach it,
and killing a group needs someone alive to do it), a child subreaper (also needs gyre
alive), a watchdog process (one more process that must itself not be left behind).

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
with one line on stderr. Closers get `STOP_GRACE_S`; a second signal, or the grace
running out, ends the process at once (after killing its children): the data on disk
is then what a kill -9 leaves, which a resume handles.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 180
"""How long the Prefect server may take to answer its health check (unless
`PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS` says otherwise): it took 15 s on the 2-core
box at load average 5, and several times that at load average 10."""
STOP_GRACE_S = 20.0
"""How long the closers of a stopping run may take before the process ends regardless."""
SERVER_STOP_S = 5.0
"""How long the Prefect server gets to exit on SIGTERM before SIGKILL."""

_PDEATHSIG_EXEC = (
    "import ctypes, os, signal, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:\n"  # 1: PR_SET_PDEATHSIG
    "    raise OSError(ctypes.get_errno(), 'prctl(PR_SET_PDEATHSIG)')\n"
    "if os.getppid() != int(sys.argv[1]):\n"  # the parent died before the signal was armed
    "    os._exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def with_parent_death_signal(argv: list[str]) -> list[str]:
    """`argv` run so that it is SIGKILLed when the thread that starts it ends (start it from the
    main thread: then when this process ends, however it ends)."""
    return [sys.executable, "-c", _PDEATHSIG_EXEC, str(os.getpid()), *argv]


class PrefectServer:
    """Prefect's API server as a child of this process that cannot outlive it."""

    def __init__(self, startup_timeout_s: float | None = None) -> None:
        configured = os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")
        self.startup_timeout_s = startup_timeout_s or float(configured or STARTUP_TIMEOUT_S)
        self.process: subprocess.Popen | None = None
        self.api_url = ""

    def start(self) -> PrefectServer:
        """Start the server, wait for its health check, set `PREFECT_API_URL` for this process.
        Call before Prefect is imported (its settings are read once, at import)."""
        # found, not imported: Prefect reads its settings (PREFECT_API_URL) once, when first imported
        site_packages = Path(importlib.util.find_spec("prefect").origin).parent.parent
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        port = sock.getsockname()[1]
        self.api_url = f"http://127.0.0.1:{port}/api"
        argv = [sys.executable, "-m", "uvicorn", "--app-dir", str(site_packages),
                "--factory", "prefect.server.api.server:create_app", "--fd", str(sock.fileno()),
                "--log-level", "error", "--lifespan", "on"]
        # what Prefect's own ephemeral server sets: no UI, the ephemeral server's services
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT__SERVER_FINAL": "1"}
        env.pop("PREFECT_API_URL", None)
        self._log = tempfile.TemporaryFile()  # read only if it fails to start; a pipe could fill and block it
        self.process = subprocess.Popen(with_parent_death_signal(argv), env=env, pass_fds=(sock.fileno(),),
                                        stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        sock.close()
        self._wait_healthy()
        os.environ["PREFECT_API_URL"] = self.api_url
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    self._log.seek(0)
                    err = self._log.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"Prefect server exited with {self.process.returncode} while starting: {err}")
                try:
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"Prefect server did not answer {self.api_url}/health within {self.startup_timeout_s:.0f} s "
                           "(set PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")

    def stop(self) -> None:
        if self.process is None:
            return
        # send the API logs still queued while the server can take them: left queued, Prefect's
        # exit hook retries them against the stopped server for ~70 s before the process exits
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=LOG_DRAIN_S)
        proc, self.process = self.process, None
        proc.terminate()
        try:
            proc.wait(timeout=SERVER_STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


LOG_DRAIN_S = 5.0
"""How long stopping gyre's own Prefect server waits for queued API logs to be sent first."""
API_PROBE_ATTEMPTS = 3
"""Health checks of a configured PREFECT_API_URL before a run starts, `API_PROBE_BACKOFF_S` apart."""
API_PROBE_BACKOFF_S = 2.0
API_PROBE_TIMEOUT_S = 10.0


def check_prefect_api(url: str) -> None:
    """A clear error, before any work, when the Prefect server `url` (PREFECT_API_URL) does not
    answer its health check; Prefect itself would fail later with a long traceback."""
    health = url.rstrip("/") + "/health"
    reason = ""
    for attempt in range(API_PROBE_ATTEMPTS):
        if attempt:
            time.sleep(API_PROBE_BACKOFF_S)
        try:
            response = httpx.get(health, timeout=API_PROBE_TIMEOUT_S)
        except httpx.HTTPError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            continue
        if response.status_code == 200:
            return
        reason = f"{health} answered HTTP {response.status_code}"
    raise ConnectionError(
        f"PREFECT_API_URL={url}: no Prefect server answers ({reason}); start one "
        "(`prefect server start --host 127.0.0.1`) or unset PREFECT_API_URL and gyre starts its own")


_closers: list[Callable[[], None]] = []
_closers_lock = threading.Lock()


def on_stop(closer: Callable[[], None]) -> Callable[[], None]:
    """Run `closer` when a stop signal ends the run; returns the function that unregisters it."""
    with _closers_lock:
        _closers.append(closer)

    def unregister() -> None:
        with _closers_lock:
            if closer in _closers:
                _closers.remove(closer)

    return unregister


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

    def __init__(self, server: PrefectServer | None, message: Callable[[int], str]) -> None:
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
        print(self.message(signum), file=sys.stderr, flush=True)
        timer = threading.Timer(STOP_GRACE_S, self._exit, args=(signum,))
        timer.daemon = True
        timer.start()
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


def attach(coord) -> Callable[[], None]:
    """Tie a run's coordinator to this process's lifecycle: a stop signal closes it in order,
    and `RUN_DIR/live.duckdb` is refreshed after every step and evaluation round
    (`gyre.live_export`). Returns the function that undoes both (call it before closing)."""
    from gyre.live_export import LiveExport
    from gyre.progress import subscribe

    undo = [on_stop(coord.close), subscribe(LiveExport(coord.store, coord.run_dir))]

    def detach() -> None:
        for fn in undo:
            fn()

    return detach
