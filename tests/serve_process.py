"""Proxy servers as child processes on 127.0.0.1, for tests that signal, kill or load them.

Two kinds: `gyre proxy serve` itself (real CLI, real torch engine on the tiny model), and
the real proxy app in front of the `NullEngine` (`python -m tests.serve_process`), whose
engine answers at once, so what a test measures is the proxy. Both bind port 0 and say
which port they got: `gyre proxy serve` in uvicorn's start-up line, the null proxy in a
JSON line on stdout. A thread drains each child's output so its pipe never fills. Callers
kill the child, and every process it started (the tokenizer's helper), by PID in a
`finally` (`stop`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 180.0
"""Start-up at load average 10: importing torch and transformers alone can take a minute."""
_UVICORN_PORT = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


class Child:
    """A child process whose output lines are collected; `wait_for` finds one."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1)
        self.lines: list[str] = []
        self._new = threading.Condition()
        threading.Thread(target=self._drain, daemon=True, name=f"drain-{self.proc.pid}").start()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            with self._new:
                self.lines.append(line.rstrip("\n"))
                self._new.notify_all()
        with self._new:
            self._new.notify_all()

    def wait_for(self, pattern: re.Pattern, timeout_s: float = START_TIMEOUT_S) -> re.Match:
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._new:
            while True:
                for line in self.lines[seen:]:
                    if (match := pattern.search(line)) is not None:
                        return match
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self.proc.poll() is not None or left <= 0:
                    raise AssertionError(f"no line matching {pattern.pattern!r} (exit {self.proc.poll()}):\n"
                                         + "\n".join(self.lines[-40:]))
                self._new.wait(min(left, 1.0))

    def output(self) -> str:
        with self._new:
            return "\n".join(self.lines)

    def stop(self) -> None:
        """Kill the child and the processes it started (by PID) if they still run, and reap it."""
        started = _descendants(self.proc.pid) if self.proc.poll() is None else []
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        for pid in started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it had exited already


def _descendants(pid: int) -> list[int]:
    """Every process `pid` started, and theirs (Linux: /proc/PID/task/TID/children)."""
    children = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(c) for c in (task / "children").read_text().split()]
    except FileNotFoundError:  # the process, or one of its threads, ended meanwhile
        pass
    return children + [d for c in children for d in _descendants(c)]


def start_gyre_proxy_serve(tmp_path: Path, model_dir: Path, keys: dict[str, str]) -> tuple[Child, int, Path]:
    """`gyre proxy serve` on a free port with one torch engine on `model_dir`, recording calls.
    Returns (child, port, DuckDB record path)."""
    record = tmp_path / "calls.duckdb"
    config = yaml.safe_load((REPO / "configs" / "proxy-local.yaml").read_text())
    config.update(port=0, model={"path": str(model_dir)}, cache_dir=str(tmp_path / "cache"),
                  record_path=str(record), engines=[{"id": "torch-0"}], keys=keys)
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    child = Child([sys.executable, "-m", "gyre.cli.main", "proxy", "serve", "--config", str(path)])
    try:
        port = int(child.wait_for(_UVICORN_PORT).group(1))
    except BaseException:
        child.stop()
        raise
    return child, port, record


def start_null_proxy(num_keys: int, max_context_tokens: int) -> tuple[Child, int, list[str]]:
    """The proxy app (tiny tokenizer and chat template) in front of a `NullEngine`.
    Returns (child, port, one key per execution)."""
    child = Child([sys.executable, "-m", "tests.serve_process", str(num_keys), str(max_context_tokens)])
    try:
        ready = json.loads(child.wait_for(re.compile(r"^\{\"port\".*\}$")).group(0))
    except BaseException:
        child.stop()
        raise
    return child, ready["port"], ready["keys"]


def _serve_null(num_keys: int, max_context_tokens: int) -> None:
    from gyre.benches.proxy import NullEngine, _output_ids, _tokenizer
    from gyre.engines.models.hf import stop_token_ids
    from gyre.net.server_thread import ServerThread
    from gyre.proxy.app import create_app
    from gyre.proxy.router import EngineRouter
    from gyre.proxy.sessions import SessionRegistry

    tokenizer = _tokenizer()
    sessions = SessionRegistry()
    app = create_app(EngineRouter([NullEngine(_output_ids(tokenizer))]), sessions, tokenizer, model_name="null",
                     stop_token_ids=stop_token_ids(tokenizer), max_context_tokens=max_context_tokens)
    server = ServerThread(app).start()
    keys = [sessions.mint(f"exec-{i}") for i in range(num_keys)]
    print(json.dumps({"port": server.port, "keys": keys}), flush=True)
    threading.Event().wait()  # serve until killed


if __name__ == "__main__":
    _serve_null(int(sys.argv[1]), int(sys.argv[2]))
