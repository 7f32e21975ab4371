"""What a docker sandbox's container is made of: its creation arguments, its slots, its users, its engine.

`container_kwargs` (pure) builds the arguments of `client.containers.run` (the SDK's names):
docker's init as PID 1 (`sleep infinity` there would never reap the orphans of a killed command, and
their zombies would hold the pids limit until no exec could start), no network, pids / memory / CPU
caps and rlimits from `SandboxLimits`, no capabilities, no privilege escalation, a read-only root with
a tmpfs `/tmp`, the workspace and the slots bound, gyre's label on it.
`make_slots` creates the bridge directory and the evaluation slots on the host (owned by the
evaluation's user, `evaluation_user()`, mode 0700; `agent_dirs` inside them the agent's own).
`resolve_image` applies `sandbox.docker.base_images` (an image this machine cannot pull replaced by a
local one); `cgroup_parent` puts the containers' cgroups under gyre's own memory cgroup (the engine
otherwise makes them at each hierarchy's root, where nothing gyre's limits cover charges them).
`engine_problem()` says, before a run starts, why no container could be started here (SDK
missing, no engine answering), so `sandbox.type: docker` fails at preflight with the reason
instead of at the first execution; `engine_answers()` turns an engine that stops answering mid-run (its
socket refused or cut) into `SandboxLostError`, never the agent's doing; `engine_call` retries a call the engine
answered with a server error (5xx: its runtime failed under load, the call did nothing) a few times before it
raises. `gyre.sandboxes.docker` runs the container.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gyre.sandboxes.base import SandboxLimits, SandboxLostError
from gyre.sandboxes.bridge import INSIDE_DIR as BRIDGE_DIR
from gyre.sandboxes.local.session import EVAL_USER

DEFAULT_IMAGE = "python:3.11-slim"
DEFAULT_WORKDIR = "/app"
PING_TIMEOUT_S = 10
SLOTS_SUFFIX = ".docker"
BRIDGE_SLOT = ".bridge"
READ_ONLY_SLOTS = frozenset({"tests", "plugin"})
CONTAINER_LABEL = "gyre"
"""Label on every container gyre starts (`docker ps --filter label=gyre` lists what is left)."""


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


def requested_image(image: str | None, dockerfile: str | None) -> str:
    """The image a container is asked for: `image`; with none, "" when the task's Dockerfile is built, else
    `DEFAULT_IMAGE`."""
    return image if image is not None else ("" if dockerfile is not None else DEFAULT_IMAGE)


def mapped_image(requested: str, base_images: Mapping[str, str]) -> str | None:
    """What `base_images` maps `requested` to: its own key, else the longest pattern key that matches it
    (`ghcr.io/laude-institute/t-bench/*`, shell-style); None when none does (the key `"*"` alone is not a
    pattern here: it replaces only what the engine lacks, `docker_build.map_from_lines`)."""
    if requested in base_images:
        return base_images[requested]
    patterns = sorted((k for k in base_images if "*" in k and k != "*" and fnmatch.fnmatchcase(requested, k)),
                      key=len, reverse=True)
    return base_images[patterns[0]] if patterns else None


def resolve_image(requested: str, base_images: Mapping[str, str]) -> tuple[str, str]:
    """The image a container starts from for `requested`, and what its execution records
    (`executions.image`): `requested -> used` when `base_images` replaced it, else the image."""
    used = mapped_image(requested, base_images) or requested
    return used, requested if used == requested else f"{requested} -> {used}"


def cgroup_parent(name: str, proc_cgroup: str = "/proc/self/cgroup") -> str | None:
    """`name` under this process's memory cgroup (cgroup v1's memory line, else v2's unified one): the
    `cgroup_parent` of a container on an engine with the cgroupfs driver. None for an empty name."""
    if not name:
        return None
    paths = {}
    for line in Path(proc_cgroup).read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else ["unified"]:
            paths[controller] = path
    own = paths.get("memory", paths.get("unified", "/"))
    return f"{own.rstrip('/')}/{name}"


def evaluation_user() -> tuple[int, int]:
    """uid/gid an in-container evaluation runs as and its slots belong to: 65533 when gyre is root
    (it can hand the slots over), else gyre's own (it cannot); never the agent's root."""
    if os.geteuid() == 0:
        return EVAL_USER.uid, EVAL_USER.gid
    return os.geteuid(), os.getegid()


def container_kwargs(
    image: str, workspace: Path, workdir: str, limits: SandboxLimits, env: Mapping[str, str], name: str,
    binds: Sequence[tuple[Path, str, str]] = (), cgroup: str | None = None,
) -> dict[str, Any]:
    """Arguments for `client.containers.run` (the SDK's names); `binds`: (host, inside, "ro"/"rw")
    added to the workspace's mount; `cgroup`: the cgroup parent (`cgroup_parent`). See the module docstring."""
    volumes = {str(workspace): {"bind": workdir, "mode": "rw"}}
    volumes.update({str(host): {"bind": inside, "mode": mode} for host, inside, mode in binds})
    return {
        "image": image,
        "command": ["sleep", "infinity"],
        "init": True,  # docker's tini as PID 1 reaps what a kill orphans: zombies would hold the pids limit
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
        "volumes": volumes,
        "working_dir": workdir,
        "environment": dict(env),
        "ulimits": [
            {"name": "fsize", "soft": limits.max_file_bytes, "hard": limits.max_file_bytes},
            {"name": "nofile", "soft": limits.max_open_files, "hard": limits.max_open_files},
            {"name": "cpu", "soft": limits.cpu_s, "hard": limits.cpu_s + 1},
        ],
        "auto_remove": False,
        "labels": {CONTAINER_LABEL: "1"},
        **({"cgroup_parent": cgroup} if cgroup else {}),
    }


def make_slots(slot_root: Path, slots: Mapping[str, str], agent_dirs: Iterable[str],
               owner: tuple[int, int]) -> list[tuple[Path, str, str]]:
    """Create the bridge directory and the evaluation slots under `slot_root`; returns their binds."""
    bridge = slot_root / BRIDGE_SLOT
    bridge.mkdir(parents=True)
    bridge.chmod(0o711)  # the agent reaches the socket, lists nothing
    binds = [(bridge, BRIDGE_DIR, "ro")]
    agent_dirs = tuple(agent_dirs)
    for name, inside in slots.items():
        host = slot_root / name
        host.mkdir()
        opened = [slot_root / d for d in agent_dirs if d.split("/", 1)[0] == name]
        for directory in opened:
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o777)
        if os.geteuid() == 0:
            os.chown(host, *owner)
        host.chmod(0o755 if opened else 0o700)
        binds.append((host, inside, "ro" if name in READ_ONLY_SLOTS else "rw"))
    return binds


@contextmanager
def engine_answers() -> Iterator[None]:
    """Engine calls in this block that find no engine (the SDK's connection to its socket refused or cut: the
    engine died or was stopped) raise `SandboxLostError`, not the agent's doing; every other error passes."""
    import requests  # the docker SDK's transport

    try:
        yield
    except requests.exceptions.ConnectionError as exc:
        raise SandboxLostError(f"the docker engine stopped answering: {type(exc).__name__}: {exc}") from exc


ENGINE_RETRIES = 3
"""How many more times `engine_call` makes a call the engine answered with a server error."""
ENGINE_BACKOFF_S = 0.5
"""`engine_call`'s first wait before a retry; each next one doubles it (0.5, 1, 2 s)."""

log = logging.getLogger(__name__)


def engine_call(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`call(*args, **kwargs)` (a docker SDK call on a container), made again after `ENGINE_BACKOFF_S` (doubling)
    while the engine answers it with a server error, at most `ENGINE_RETRIES` more times; the last one raised.
    A 5xx is the engine's own failure (its runtime timed out freezing a cgroup or creating an exec under load)
    with nothing done: an exec's process starts only once its stream is hijacked, past any HTTP status. A
    4xx (a container that stopped, was removed, is paused) is an answer, raised at once."""
    attempt = 0
    while True:
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            server_error = getattr(exc, "is_server_error", None)  # docker.errors.APIError's
            if attempt == ENGINE_RETRIES or not (callable(server_error) and server_error()):
                raise
            wait_s = ENGINE_BACKOFF_S * 2 ** attempt
            log.warning("the docker engine failed %s (%s); again in %.1f s", getattr(call, "__name__", call), exc,
                        wait_s)
            time.sleep(wait_s)
            attempt += 1


def container_name(container: Any) -> str:
    return str(getattr(container, "name", None) or getattr(container, "id", "?"))
