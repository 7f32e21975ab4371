"""The `sandbox` section: where an execution's commands run (a local workspace under bubblewrap, or a Docker
container per execution) and the limits every command runs under. Re-exported by `gyre.config.run`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gyre.config.base import Section


class DockerConfig(Section):
    base_images: dict[str, str] = Field(default_factory=dict)
    """Images this machine cannot pull, replaced by local ones: requested name -> local name (e.g.
    `python:3.11-slim: gyre-base:local`, the Debian base `scripts/docker-engine.sh` builds offline). Applied
    to every image a container starts from (a task's, `sandbox.image`, the default) and to the FROM lines of a
    task's Dockerfile when it is built (there the key `"*"` replaces any other image the engine lacks). A key
    with `*` is a pattern (`ghcr.io/laude-institute/t-bench/*`), the longest match wins after an exact key; an
    execution whose image was replaced records `requested -> used` in `executions.image`."""
    build_task_images: bool = True
    """Build a Terminal-Bench or Harbor task's own Dockerfile (cached by its build context's digest,
    `gyre.sandboxes.docker_build`) and run its executions in that image, the workspace seeded from the image's
    working directory when the task has no `start/`; false: `sandbox.image` for every task."""
    build_timeout_s: float = Field(default=1800.0, gt=0)
    """Seconds one task image's build may take."""
    build_network: Literal["none", "package-index", "host"] = "none"
    """The network a task image's build steps get: none; `package-index`, gyre's allow-listed index proxy and
    nothing else (`RUN pip install ...` works, apt and curl do not: `gyre.sandboxes.build_index`); or the host's
    (what upstream's `docker compose build` gives: a `RUN apt-get install ...` needs it; the build runs the
    task's Dockerfile, never the agent's code)."""
    agent_network: Literal["none", "package-index"] = "none"
    """The agent's network: none (the default), or `package-index`: gyre's allow-listed index proxy and nothing
    else, its own per execution, closed when the agent ends (`gyre.sandboxes.agent_index`; upstream's agents have
    the network: reference solutions `pip install` what they need)."""
    index_url: str | None = None
    """The index `build_network` / `agent_network: package-index` proxy (None: the one pip here is configured
    with)."""
    pull: bool = False
    """Pull an image the engine does not have from its registry (a cluster's). Off: never; a missing image is
    replaced (`base_images`, the task's Dockerfile built) or the execution records why it could not start (no
    registry answers here, and a pull is traffic off the machine)."""
    cgroup_parent: str = "gyre-docker"
    """cgroup the containers' cgroups are made under, relative to gyre's own memory cgroup (so what a
    container uses is charged where gyre's is, not at the hierarchy's root); "" leaves it to the engine."""


class SandboxConfig(Section):
    type: Literal["local", "docker"] = "local"
    """Sandbox backend: `local` (a workspace directory per execution, bubblewrap + resource limits)
    or `docker` (a container per execution; needs `pip install gyre-rl[docker]` and a running Docker
    engine, checked before the run starts)."""
    image: str | None = None
    """`docker`: the image for queries whose benchmark names none (None: python:3.11-slim)."""
    docker: DockerConfig = DockerConfig()
    """`docker`: image substitutions and the containers' cgroup parent."""
    cpu_seconds: int = Field(default=60, gt=0)
    """CPU-time limit per process started in the sandbox."""
    max_file_bytes: int = Field(default=64 * 2**20, gt=0)
    """Largest file a sandboxed process may write."""
    memory_bytes: int = Field(default=2 * 2**30, gt=0)
    """Address-space limit per sandboxed process."""
    isolation: Literal["auto", "bwrap", "none"] = "auto"
    """`auto`: bubblewrap namespaces when `bwrap` works, else plain processes with a loud warning, and an
    error instead when gyre runs as root (agent code would run as root, unconfined); `bwrap`: refuse to run
    without it; `none`: plain processes (trusted models only; as root, only when asked for by name)."""
    max_processes: int = Field(default=256, gt=0)
    """Processes + threads of one command's whole tree (cgroup pids.max, where cgroups work)."""
    tree_memory_bytes: int = Field(default=4 * 2**30, gt=0)
    """Memory of one command's whole tree (cgroup memory limit, where cgroups work)."""
    cpu_cores: float = Field(default=1.0, gt=0)
    """CPU cores one command's tree may use (cgroup CPU quota, where cgroups work)."""
    max_workspace_bytes: int = Field(default=2 * 2**30, gt=0)
    """Bytes the workspace and scratch /tmp may hold; a command is killed beyond it."""
