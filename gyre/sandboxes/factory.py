"""Which sandbox backend an execution gets: `sandbox.type` decides, here and nowhere else.

The coordinator asks `create_sandbox` for each execution's sandbox and never branches on
backends; `check_backend` runs at preflight, so a run configured for a backend this
machine cannot provide (`docker` without a Docker engine) stops before anything is built,
with the reason and what to do about it, instead of failing every execution.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gyre.config import SandboxConfig
from gyre.records import Query
from gyre.sandboxes.base import Sandbox, SandboxLimits
from gyre.sandboxes.isolation import Isolation
from gyre.sandboxes.layout import Mount, SandboxLayout


class SandboxBackendError(ValueError):
    """The configured sandbox backend cannot run on this machine."""


def check_backend(config: SandboxConfig, harness_type: str = "builtin") -> None:
    """Raise SandboxBackendError when `config.type` cannot start sandboxes here, or cannot run
    `harness_type` (a container has no bridge to the proxy yet: only the builtin harness, which
    calls the model from the host, works in one)."""
    if config.type == "docker" and harness_type != "builtin":
        raise SandboxBackendError(
            f"sandbox.type 'docker' runs only harness.type 'builtin': a {harness_type!r} harness runs inside "
            "the container, which has no way to the proxy yet; use sandbox.type: local"
        )
    if config.type == "docker":
        from gyre.sandboxes.docker import engine_problem

        problem = engine_problem()
        if problem is not None:
            raise SandboxBackendError(
                f"sandbox.type is 'docker' but {problem}. Start a Docker engine (or point DOCKER_HOST at one), "
                "or set sandbox.type: local (bubblewrap)"
            )


def create_sandbox(
    config: SandboxConfig,
    query: Query,
    workspace: Path,
    env: Mapping[str, str],
    limits: SandboxLimits,
    isolation: Isolation,
    *,
    image: str | None = None,
    workdir: str | None = None,
    session_slots: Mapping[str, str] | None = None,
    agent_dirs: tuple[str, ...] = (),
    mounts: tuple[Mount, ...] = (),
) -> Sandbox:
    """A fresh sandbox for one execution; `image` / `workdir` are what the query's format asks for.

    `session_slots` (local, bubblewrap): one long-lived session with these evaluation slots, for an
    in-place evaluation (`gyre.sandboxes.session`); `mounts` are added read-only."""
    if config.type == "docker":
        from gyre.sandboxes.docker import DockerSandbox

        return DockerSandbox.create(query, workspace, env, limits, image=image or config.image, workdir=workdir)
    from gyre.sandboxes.local import LocalSandbox

    layout = SandboxLayout(workdir=workdir, mounts=mounts) if isolation.bwrap else None
    return LocalSandbox.create(query, workspace, env=env, limits=limits, isolation=isolation, layout=layout,
                               session_slots=session_slots if isolation.bwrap else None, agent_dirs=agent_dirs)
