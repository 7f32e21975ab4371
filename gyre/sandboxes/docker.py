"""DockerSandbox: one container per execution through the docker SDK (`pip install gyre-rl[docker]`).

For tasks that ship an image (Terminal-Bench, Harbor, R2E-Gym) and hosts running a
Docker engine. The container gets: no network (`network_mode="none"`), a pids / memory /
CPU cap from `SandboxLimits`, no capabilities, no privilege escalation, a read-only
root filesystem with a tmpfs `/tmp`, and exactly one host mount: the workspace at the
task's workdir (`/app` by default). Commands run with `docker exec` as `bash -c`, with
the scrubbed environment; the container is removed at `close()`, the workspace kept.
`container_kwargs` (pure) builds the arguments and is what the unit tests check; the SDK
is imported only when a container is really started. Known gap: `docker exec` has no
timeout of its own, so a timed-out command is stopped by killing the whole container
(`docker kill`); the sandbox is closed after that, the workspace kept. Another: the
container has no way to the proxy (no bridge like the local sandbox's), so only the
`builtin` harness, which calls the model from the host, runs in it.

`engine_problem()` says, before a run starts, why no container could be started here
(SDK missing, no engine answering), so `sandbox.type: docker` fails at preflight with
the reason instead of at the first execution.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gyre.records import Query
from gyre.sandboxes.base import ExecResult, SandboxLimits
from gyre.sandboxes.git_history import strip_git_history
from gyre.sandboxes.paths import read_inside, write_inside
from gyre.sandboxes.process import BoundedCapture

DEFAULT_IMAGE = "python:3.11-slim"
DEFAULT_WORKDIR = "/app"
PING_TIMEOUT_S = 10


def engine_problem() -> str | None:
    """Why no Docker engine can be used from here, or None when one answers a ping."""
    try:
        import docker  # the optional extra, imported only here
    except ImportError:
        return "the docker SDK is not installed (pip install 'gyre-rl[docker]')"
    try:
        docker.from_env(timeout=PING_TIMEOUT_S).ping()
    except docker.errors.DockerException as exc:
        return f"no Docker engine answers at {os.environ.get('DOCKER_HOST') or 'the default socket'}: {exc}"
    return None


def container_kwargs(
    image: str, workspace: Path, workdir: str, limits: SandboxLimits, env: Mapping[str, str], name: str
) -> dict[str, Any]:
    """Arguments for `client.containers.run` (the SDK's names); see the module docstring."""
    return {
        "image": image,
        "command": ["sleep", "infinity"],
        "name": name,
        "detach": True,
        "network_mode": "none",
        "pids_limit": limits.max_processes,
        "mem_limit": limits.memory_bytes,
        "memswap_limit": limits.memory_bytes,
        "nano_cpus": int(limits.cpu_cores * 1e9),
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "read_only": True,
        "tmpfs": {"/tmp": f"size={min(limits.max_workspace_bytes, 1 << 30)}"},
        "volumes": {str(workspace): {"bind": workdir, "mode": "rw"}},
        "working_dir": workdir,
        "environment": dict(env),
        "ulimits": [
            {"name": "fsize", "soft": limits.max_file_bytes, "hard": limits.max_file_bytes},
            {"name": "nofile", "soft": limits.max_open_files, "hard": limits.max_open_files},
            {"name": "cpu", "soft": limits.cpu_s, "hard": limits.cpu_s + 1},
        ],
        "auto_remove": False,
    }


@dataclass
class DockerSandbox:
    workspace: Path
    container: Any
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    workdir: str = DEFAULT_WORKDIR
    closed: bool = field(default=False, init=False)

    @classmethod
    def create(
        cls,
        query: Query,
        workspace: Path,
        env: Mapping[str, str] | None = None,
        limits: SandboxLimits | None = None,
        *,
        image: str | None = None,
        workdir: str | None = None,
    ) -> DockerSandbox:
        import docker  # the optional extra, imported only here

        workspace = Path(workspace).resolve()
        if workspace.exists() and any(workspace.iterdir()):
            raise FileExistsError(f"workspace {workspace} already exists and is not empty")
        workspace.mkdir(parents=True, exist_ok=True)
        if query.start_dir is not None:
            shutil.copytree(query.start_dir, workspace, symlinks=True, dirs_exist_ok=True)
            strip_git_history(workspace)
        limits = limits or SandboxLimits()
        workdir = workdir or DEFAULT_WORKDIR
        kwargs = container_kwargs(image or DEFAULT_IMAGE, workspace, workdir, limits, dict(env or {}),
                                  f"gyre-{workspace.name}")
        container = docker.from_env().containers.run(**kwargs)
        return cls(workspace=workspace, container=container, limits=limits, workdir=workdir)

    def exec(self, command: str, timeout_s: float) -> ExecResult:
        if self.closed:
            raise RuntimeError(f"sandbox for {self.workspace} is closed")
        started = time.monotonic()
        outcome: dict[str, Any] = {}

        def run() -> None:
            outcome["result"] = self.container.exec_run(["bash", "-c", command], workdir=self.workdir, demux=True)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            self.container.kill()
            self.closed = True
            return ExecResult(-9, "", "", True, time.monotonic() - started)
        result = outcome["result"]
        out, err = (BoundedCapture(self.limits.max_output_bytes) for _ in range(2))
        stdout, stderr = result.output
        out.add(stdout or b"")
        err.add(stderr or b"")
        return ExecResult(result.exit_code, out.text(), err.text(), False, time.monotonic() - started)

    def read_file(self, rel: str) -> str:
        return read_inside(self.workspace, rel)

    def write_file(self, rel: str, content: str) -> None:
        write_inside(self.workspace, rel, content)

    def close(self) -> None:
        if self.container is not None:
            try:
                self.container.remove(force=True)
            finally:
                self.container = None
        self.closed = True

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.workspace)
