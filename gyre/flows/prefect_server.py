"""Prefect's API server for `gyre run`, started by gyre as a child that cannot outlive it.

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
alive), a watchdog process (one more process that must itself not be left behind). The server runs in a session
of its own, so a signal to gyre's process group (Ctrl-C at a terminal) reaches gyre only: gyre still needs the
server to mark its runs Cancelled, and stops it after.

`check_prefect_api` probes a server the user configured (`PREFECT_API_URL`) before any work.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 180
"""How long the Prefect server may take to answer its health check (unless
`PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS` says otherwise): it took 15 s on the 2-core
box at load average 5, and several times that at load average 10."""
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

    def __init__(self, startup_timeout_s: float | None = None, home: Path | None = None) -> None:
        configured = os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")
        self.startup_timeout_s = startup_timeout_s or float(configured or STARTUP_TIMEOUT_S)
        self.home = home
        """The server's PREFECT_HOME (its database lives there); None: the caller's."""
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
        if self.home is not None:
            env["PREFECT_HOME"] = str(self.home)
        self._log = tempfile.TemporaryFile()  # read only if it fails to start; a pipe could fill and block it
        # its own session: Ctrl-C at a terminal (SIGINT to the whole foreground group) or `timeout` (SIGTERM to its
        # group) reach gyre, which marks its flow and task runs Cancelled through this server and then stops it;
        # they killed the server first, and the runs read Running for good
        self.process = subprocess.Popen(with_parent_death_signal(argv), env=env, pass_fds=(sock.fileno(),),
                                        stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
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


