"""Which sandbox backend an execution gets: `sandbox.type` decides, here and nowhere else.

The coordinator asks `create_sandbox` for each execution's sandbox and never branches on
backends; `check_backend` runs at preflight, so a run configured for a backend this
machine cannot provide (`docker` without a Docker engine) stops before anything is built,
with the reason and what to do about it, instead of failing every execution.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from gyre.config.run import SandboxConfig
from gyre.records import Query
from gyre.sandboxes.base import Sandbox, SandboxLimits
from gyre.sandboxes.layout import Mount, SandboxLayout
from gyre.sandboxes.local.isolation import Isolation


class SandboxBackendError(ValueError):
    """The configured sandbox backend cannot run on this machine."""


def check_backend(config: SandboxConfig, harness_type: str = "builtin") -> None:
    """Raise SandboxBackendError when `config.type` cannot start sandboxes here. Every harness type
    runs in either backend: a CLI harness in a container reaches the proxy through the bridge
    (`DockerSandbox.open_proxy`; an image without python3 fails its command with that reason)."""
    del harness_type  # kept for callers: no backend refuses a harness type any more
    if config.type == "docker":
        from gyre.sandboxes.docker_container import engine_problem

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
    dockerfile: str | None = None,
    workdir: str | None = None,
    session_slots: Mapping[str, str] | None = None,
    agent_dirs: tuple[str, ...] = (),
    mounts: tuple[Mount, ...] = (),
    eval_slots: Mapping[str, str] | None = None,
    packages: tuple[str, ...] = (),
    is_project: Callable[[str, list[str]], bool] | None = None,
    recipe=None,
) -> Sandbox:
    """A fresh sandbox for one execution; `image` / `dockerfile` / `workdir` are what the query's format asks
    for (docker: the task's image, else its Dockerfile built when `sandbox.docker.build_task_images`).

    `session_slots` (local, bubblewrap): one long-lived session with these evaluation slots, for an
    in-place evaluation (`gyre.sandboxes.local.session`); `mounts` are added read-only.
    `eval_slots` (docker): evaluation slots bound into the container for an in-container evaluation
    (`gyre.evaluators.formats.in_container`); `agent_dirs` applies to them as to session slots.
    `packages` (docker): what the task's image holds on top of its base (NL2RepoBench, `docker_image`); `is_project`:
    which of its distributions is the task's own project (removed again, `packages_image`). `recipe` (docker): a
    SWE-bench instance's images (`swe_image.EnvironmentRecipe`), built and run instead."""
    if config.type == "docker":
        from gyre.sandboxes.docker import DockerSandbox

        image, build = _docker_request(config, image, dockerfile)
        return DockerSandbox.create(query, workspace, env, limits, image=image,
                                    workdir=workdir, eval_slots=eval_slots, agent_dirs=agent_dirs,
                                    base_images=config.docker.base_images,
                                    cgroup_parent_name=config.docker.cgroup_parent, dockerfile=build,
                                    build_timeout_s=config.docker.build_timeout_s,
                                    build_network=config.docker.build_network, pull=config.docker.pull,
                                    index_url=config.docker.index_url,
                                    agent_index=config.docker.agent_network == "package-index",
                                    packages=packages, is_project=is_project, recipe=recipe)
    from gyre.sandboxes.local.sandbox import LocalSandbox

    layout = SandboxLayout(workdir=workdir, mounts=mounts) if isolation.bwrap else None
    return LocalSandbox.create(query, workspace, env=env, limits=limits, isolation=isolation, layout=layout,
                               session_slots=session_slots if isolation.bwrap else None, agent_dirs=agent_dirs)


def docker_image(config: SandboxConfig, query: Query, *, image: str | None = None, dockerfile: str | None = None,
                 workdir: str | None = None, packages: tuple[str, ...] = (),
                 is_project: Callable[[str, list[str]], bool] | None = None, recipe=None) -> tuple[str, str]:
    """The image `create_sandbox` runs an execution of `query` from under `config` (docker), and what the execution
    records: built or found as for the agent (`packages_image.execution_image`), so an evaluation that runs in a
    fresh container of it (NL2RepoBench) finds the agent's image in the engine's cache."""
    import docker

    from gyre.sandboxes.docker_container import DEFAULT_WORKDIR, engine_answers, requested_image
    from gyre.sandboxes.packages_image import execution_image

    image, build = _docker_request(config, image, dockerfile)
    with engine_answers():
        return execution_image(docker.from_env(), query.query_id, requested_image(image, build),
                               build, config.docker.base_images,
                               config.docker.build_timeout_s, config.docker.build_network, config.docker.pull,
                               config.docker.index_url, packages, workdir or DEFAULT_WORKDIR, is_project, recipe)


def _docker_request(config: SandboxConfig, image: str | None, dockerfile: str | None) -> tuple[str | None, str | None]:
    """The image a docker execution asks for and the Dockerfile it builds: the task's image, else its Dockerfile
    (`sandbox.docker.build_task_images`), else `sandbox.image`."""
    build = dockerfile if config.docker.build_task_images else None
    return image or (None if build else config.image), build


def sandbox_limits(config: SandboxConfig) -> SandboxLimits:
    """The per-execution limits a run's `sandbox` config sets."""
    return SandboxLimits(
        cpu_s=config.cpu_seconds,
        max_file_bytes=config.max_file_bytes,
        address_space_bytes=config.memory_bytes,
        max_processes=config.max_processes,
        memory_bytes=config.tree_memory_bytes,
        cpu_cores=config.cpu_cores,
        max_workspace_bytes=config.max_workspace_bytes,
    )
