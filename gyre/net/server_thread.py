"""Serving an ASGI app with uvicorn on 127.0.0.1 from a background thread.

The coordinator runs the model-call proxy in-process next to the reference engines (harnesses
reach it over real HTTP like any remote harness would); an evaluation runs its package-index
proxy the same way, and a Ray rank its engine's server. Port 0 picks a free port; `base_url`
is known once the server has started.
"""

from __future__ import annotations

import threading
import time

import uvicorn

STARTUP_TIMEOUT_S = 30.0


class ServerThread:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, lifespan: str = "off",
                 name: str = "gyre-proxy") -> None:
        # lifespan="on" for apps that open resources in their server's event loop (an httpx client).
        # log_config=None: uvicorn's default runs logging.config.dictConfig, which shuts every existing handler
        # down under logging's global lock; Prefect's API log handler flushes through a worker thread that needs that
        # lock, so an index proxy started inside a Prefect task deadlocked the evaluation (gyre rerun-failed)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan=lifespan,
                                log_config=None)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=name, daemon=True)
        self.name = name
        self.host = host
        self.port: int | None = None

    def start(self) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"{self.name}: server thread exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: server did not start within {STARTUP_TIMEOUT_S} s")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://{self.host}:{self.port}/v1"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
