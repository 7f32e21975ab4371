"""The one way out of a sandbox's network namespace: a bridge to the model proxy, nowhere else.

A harness that runs inside the sandbox (Claude Code, mini-swe-agent, a script) must reach
the proxy at its base URL, e.g. `http://127.0.0.1:8123/v1`, but the sandbox has its own
empty network namespace. The bridge has two halves joined by a Unix socket that is the
only thing bound into the sandbox from outside:

- host half (`ProxyBridge`, a daemon thread in gyre): accepts on `<dir>/proxy.sock` and
  pipes each connection to the proxy's TCP address, that address only;
- inside half (`INSIDE_FORWARDER`, a few lines of Python started in the background by
  `shell_prefix()` before the harness command): listens on 127.0.0.1:<the proxy's port>
  in the sandbox's own loopback and pipes each connection to the socket.

So the base URL means the same inside as outside, and the only destination reachable
through it is the proxy, which authenticates every request with the execution's key.

Where something else may already listen on that port inside (an in-container evaluation's index
route: the agent's processes share the container's loopback and may have bound the port first),
`shell_prefix(ready=...)` makes the inside half say it bound the port by creating a file only the
evaluation can write, and the command stops (`BRIDGE_FAILED_EXIT`) when it did not: otherwise the
squatter would answer the evaluation's installs.
"""

from __future__ import annotations

import os
import shlex
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

SOCKET_NAME = "proxy.sock"
INSIDE_DIR = "/run/gyre"
_CHUNK = 65536
BRIDGE_FAILED_EXIT = 97
"""Exit status of a command whose inside half could not bind its port (`shell_prefix(ready=...)`)."""

INSIDE_FORWARDER = r"""
import socket, sys, threading
port, path = int(sys.argv[1]), sys.argv[2]
ready = sys.argv[3] if len(sys.argv) > 3 else None
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(64)
if ready:
    open(ready, "x").close()
while True:
    conn, _ = srv.accept()
    up = socket.socket(socket.AF_UNIX)
    try:
        up.connect(path)
    except OSError:
        conn.close()
        continue
    threading.Thread(target=pipe, args=(conn, up), daemon=True).start()
    threading.Thread(target=pipe, args=(up, conn), daemon=True).start()
"""


def proxy_address(base_url: str) -> tuple[str, int]:
    """(host, port) of a proxy base URL; only loopback proxies can be bridged."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
        raise ValueError(f"proxy base URL must be http://127.0.0.1:PORT/..., got {base_url!r}")
    if parts.port < 1024:  # the sandbox has no capability to bind a privileged port
        raise ValueError(f"proxy port must be >= 1024 to be bridged into a sandbox, got {parts.port}")
    return "127.0.0.1", parts.port


@dataclass
class ProxyBridge:
    """Host half of the bridge; `close()` stops accepting (connections in flight finish)."""

    target: tuple[str, int]
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gyre-bridge-")))
    inside_dir: str = INSIDE_DIR
    """Where `directory` is shown inside the sandbox."""
    _server: socket.socket | None = field(default=None, init=False)

    @property
    def socket_path(self) -> Path:
        return self.directory / SOCKET_NAME

    def start(self) -> ProxyBridge:
        server = socket.socket(socket.AF_UNIX)
        # bound through the directory's descriptor: a unix socket's path holds at most 107 bytes, and a run's
        # slot directory (`<run dir>/workspaces/.<execution id>.docker/.bridge`) can be longer
        directory = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            server.bind(f"/proc/self/fd/{directory}/{SOCKET_NAME}")
        finally:
            os.close(directory)
        self.socket_path.chmod(0o666)  # the sandbox's uid is mapped, not gyre's
        if self.directory.stat().st_uid == os.geteuid():  # a directory gyre made; a session's slot keeps its modes
            self.directory.chmod(0o711)  # and, when gyre is root, unprivileged: it must reach the socket
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, name="gyre-proxy-bridge", daemon=True).start()
        return self

    def shell_prefix(self, python: str = "python3", ready: str | None = None) -> str:
        """Shell text to put before a command inside the sandbox: start the inside half, wait for it.
        `ready`: a path (inside) the inside half creates once it holds the port; the command stops with
        `BRIDGE_FAILED_EXIT` if it does not appear (the port taken by another process, no python)."""
        port = self.target[1]
        sock = f"{self.inside_dir}/{SOCKET_NAME}"
        start = f"{shlex.quote(python)} -c {shlex.quote(INSIDE_FORWARDER)} {port} {sock}"
        if ready is None:
            return (
                f"{start} >/dev/null 2>&1 & "
                f"for _gyre_i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; "
                "sleep 0.05; done; "
            )
        flag = shlex.quote(ready)
        return (
            f"{start} {flag} >/dev/null 2>&1 & "
            f"for _gyre_i in $(seq 100); do [ -e {flag} ] && break; sleep 0.05; done; "
            f"[ -e {flag} ] || {{ echo 'gyre: the package index could not be bridged in: 127.0.0.1:{port} is taken "
            f"inside the container, or {python} cannot run' >&2; exit {BRIDGE_FAILED_EXIT}; }}; "
        )

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def _accept(self) -> None:
        server = self._server
        while server is not None:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                conn.close()
                continue
            threading.Thread(target=_pipe, args=(conn, upstream), daemon=True).start()
            threading.Thread(target=_pipe, args=(upstream, conn), daemon=True).start()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(_CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
