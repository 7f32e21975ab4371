"""A Terminal-Bench or Harbor task's own image, built from its Dockerfile and cached by its build context.

Upstream runs each task in the image its Dockerfile builds (`docker compose build`): the tools it
installs, the files it puts in the working directory. `task_image` builds that image with the
docker SDK, tagged `gyre-task:<digest>` where the digest covers every file of the build context
(path, mode, bytes; a link's target), the Dockerfile as built and the base-image map: the same
task built twice is one build, any change is a new image, never a stale one.

No registry answers here, so a `FROM` image the engine does not have is replaced through
`sandbox.docker.base_images` (requested -> local, e.g. `python:3.13-slim: gyre-base:local`; the key
`"*"` catches every other one) in a copy of the Dockerfile; the substitution is part of what the
execution records (`BuiltImage.note`). Build steps get no network unless `sandbox.docker.build_network`
is `host` (upstream's `docker compose build` has one: a `RUN apt-get install ...` needs it). A `FROM`
that is neither here nor mapped, and a build step that fails, are a `TaskImageError` naming the task,
the image or the step, the switches that would help, and the build log's last lines.

`seed_workspace` copies what the image holds at the task's working directory into a fresh
workspace (the workspace is bind-mounted there, hiding it), around the task's `start/` files: a task
with no `start/` directory starts from what its Dockerfile put in `/app`, and an R2E-Gym repository
keeps what its image built at `/testbed` beside the checked-out commit (`.venv`, compiled extensions),
as upstream's container does.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from gyre.sandboxes.base import SandboxStartError
from gyre.sandboxes.build_index import index_route
from gyre.sandboxes.docker_container import mapped_image, resolve_image

TAG_REPOSITORY = "gyre-task"
BUILT_DOCKERFILE = ".gyre.Dockerfile"
"""The Dockerfile as built (its FROM lines mapped), written into a copy of the build context."""
ANY_BASE = "*"
"""The `base_images` key that replaces every FROM image the engine does not have and no other key names."""
PACKAGE_INDEX = "package-index"
"""`build_network` value: build steps reach gyre's allow-listed index proxy and nothing else (`build_index`)."""
LOG_TAIL_LINES = 12
SEED_IN_MEMORY_BYTES = 64 << 20
"""An image's workdir archive up to this size is read in memory, a larger one through a temporary file."""

_FROM = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE)
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class TaskImageError(SandboxStartError):
    """A task's image could not be built here; the message says which task, what and why."""


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    note: str
    """What `executions.image` records: `built <dockerfile> as <tag>`, with each FROM substitution."""
    cached: bool
    """An image of the same digest was already there: nothing was built."""


def map_from_lines(dockerfile: str, base_images: Mapping[str, str], present) -> tuple[str, list[str], list[str]]:
    """The Dockerfile with each FROM image the engine lacks (`present(name)` False) replaced through
    `base_images`, the substitutions (`requested -> used`) and the images its FROM lines then name (an earlier
    stage or a `$ARG` image is no image to check). A FROM naming an earlier stage is left alone."""
    stages: set[str] = set()
    lines, swaps, bases = [], [], []
    for line in dockerfile.splitlines():
        match = _FROM.match(line)
        if match is not None:
            head, flags, image, rest = match.groups()
            alias = re.search(r"\bAS\s+(\S+)", rest, re.IGNORECASE)
            if image.lower() not in stages and "$" not in image:
                used = mapped_image(image, base_images) or (None if present(image) else base_images.get(ANY_BASE))
                if used is not None and used != image:
                    swaps.append(f"{image} -> {used}")
                    line = f"{head}{flags}{used}{rest}"
                bases.append(used or image)
            if alias:
                stages.add(alias.group(1).lower())
        lines.append(line)
    return "\n".join(lines) + "\n", swaps, bases


def _present(client, name: str) -> bool:
    """Whether the engine has image `name` (nothing is pulled)."""
    import docker

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def declare_args(dockerfile: str, names: list[str]) -> str:
    """`dockerfile` with `ARG <name>` lines after each FROM line: build arguments the steps of every stage see."""
    declared = "".join(f"ARG {name}\n" for name in names)
    return "".join(line + (declared if _FROM.match(line.rstrip("\n")) else "")
                   for line in dockerfile.splitlines(keepends=True))


def context_digest(context: Path, dockerfile_text: str) -> str:
    """sha256 over the build context's files (sorted relative paths, modes, bytes; a link's target) and the
    Dockerfile as built."""
    digest = hashlib.sha256(dockerfile_text.encode())
    for root, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(root, d))]):
            path = Path(root) / name
            rel = path.relative_to(context).as_posix()
            info = path.lstat()
            digest.update(f"\0{rel}\0{info.st_mode:o}\0".encode())
            if path.is_symlink():
                digest.update(os.readlink(path).encode())
            elif path.is_file():
                with path.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
    return digest.hexdigest()


def task_image(client, task: str, context: Path, dockerfile: Path, base_images: Mapping[str, str],
               timeout_s: float, network: str = "none", index_url: str | None = None) -> BuiltImage:
    """The image `dockerfile` builds from `context` for task `task`: built once per digest (concurrent
    executions of one task wait for the one build), reused after. `network`: its build steps' (none,
    package-index: `build_index`, through a proxy of `index_url`, None: pip's configured index; host)."""

    def present(name: str) -> bool:
        return _present(client, name)

    text, swaps, bases = map_from_lines(Path(dockerfile).read_text(encoding="utf-8", errors="replace"), base_images,
                                        present)
    tag = f"{TAG_REPOSITORY}:{context_digest(Path(context), text)[:16]}"
    note = f"built {Path(dockerfile).name} of {task} as {tag}" + (f" ({', '.join(swaps)})" if swaps else "")
    with _locks_guard:
        lock = _locks.setdefault(tag, threading.Lock())
    with lock:
        if present(tag):
            return BuiltImage(tag, note, cached=True)
        missing = next((image for image in bases if not present(image)), None)
        if missing is not None:
            raise TaskImageError(f"task {task}: its Dockerfile starts FROM {missing}, which this engine does not "
                                 f"have and cannot pull (no registry answers here): map it to a local image "
                                 f"in sandbox.docker.base_images")
        if network == PACKAGE_INDEX:
            if not bases:
                raise TaskImageError(f"task {task}: its Dockerfile names no base image to run the build's route to "
                                     "the package index in (FROM $ARG)")
            with index_route(client, bases[-1], index_url) as route:
                _build(client, task, Path(context), declare_args(text, sorted(route.buildargs)), tag, timeout_s,
                       route.network_mode, route.buildargs)
                note += f"; its build steps reached the package index through gyre's proxy ({route.requests()} " \
                        "requests)"
        else:
            _build(client, task, Path(context), text, tag, timeout_s, network)
    return BuiltImage(tag, note, cached=False)


def _build(client, task: str, context: Path, text: str, tag: str, timeout_s: float, network: str,
           buildargs: Mapping[str, str] | None = None) -> None:
    import docker

    with tempfile.TemporaryDirectory(prefix="gyre-build-") as tmp:
        copy = Path(tmp) / "context"
        shutil.copytree(context, copy, symlinks=True)
        (copy / BUILT_DOCKERFILE).write_text(text, encoding="utf-8")
        try:
            client.images.build(path=str(copy), dockerfile=BUILT_DOCKERFILE, tag=tag, rm=True, forcerm=True,
                                pull=False, network_mode=network, labels={"gyre": "task-image", "gyre.task": task},
                                timeout=int(timeout_s), buildargs=dict(buildargs or {}))
        except docker.errors.BuildError as exc:
            lines = [str(chunk.get("stream") or chunk.get("error") or "").rstrip() for chunk in exc.build_log]
            tail = "\n".join(line for line in lines if line)[-2000:].splitlines()[-LOG_TAIL_LINES:]
            offline = ("; its build had no network: sandbox.docker.build_network: package-index gives its steps the "
                       "package index, host the host's network; build_task_images: false runs the task on "
                       "sandbox.image") if network == "none" else (
                "; its build steps reached only the package index (apt, curl and git find no network)"
                if buildargs else "")
            raise TaskImageError(f"task {task}: its image did not build ({exc.msg}{offline}):\n"
                                 + "\n".join(tail)) from exc
        except docker.errors.APIError as exc:  # refused before any step ran (a Dockerfile this builder cannot parse)
            if exc.status_code is None or exc.status_code >= 500:
                raise  # the engine's own failure: the caller's SandboxStartError says so
            raise TaskImageError(f"task {task}: its image did not build: the engine refused its Dockerfile "
                                 f"({exc.explanation or exc}; a `COPY <<EOF` heredoc or `RUN --mount` needs BuildKit, "
                                 "which this engine's builder is not)") from exc


def container_image(client, task: str, image: str, dockerfile: str | None, base_images: Mapping[str, str],
                    timeout_s: float = 1800.0, network: str = "none", pull: bool = False,
                    index_url: str | None = None) -> tuple[str, str, bool]:
    """The image an execution's container runs from, what its execution records, and whether it was built from
    the task's Dockerfile. `image` (the task's, else `sandbox.image`) mapped through `base_images` is used when the
    engine has it (or pulls it, with `pull`); else the task's `dockerfile` is built; else `base_images["*"]`;
    else `TaskImageError`: a missing image is never fetched behind the config's back. With no image the task
    named and a `dockerfile`, that is built first (the caller passes `image=""`)."""
    if image:
        used, note = resolve_image(image, base_images)
        if _present(client, used):
            return used, note, False
        if pull:
            client.images.pull(used)
            return used, f"{note} (pulled)", False
        if dockerfile is None:
            if ANY_BASE in base_images:
                return base_images[ANY_BASE], f"{image} -> {base_images[ANY_BASE]}", False
            raise TaskImageError(f"task {task}: its image {used} is not on this engine and is not pulled "
                                 f"(sandbox.docker.pull is off): map it to a local image in sandbox.docker.base_images")
    built = task_image(client, task, Path(dockerfile).parent, Path(dockerfile), base_images, timeout_s, network,
                       index_url)
    return built.tag, (f"{image} is not here: " if image else "") + built.note, True


def seed_workspace(client, image: str, workdir: str, workspace: Path) -> list[str]:
    """Copy the files `image` holds under `workdir` into the (not yet shared) `workspace`, around what is already
    there: a file the task's `start/` put there is kept (start/ wins), a directory is merged, and the image's
    `.git` is left out where start/ brought one (its history is the task's, stripped). Returns the entries left
    out by tarfile's `data` filter (devices, hard links and paths leaving the directory); a symbolic link to an
    absolute path is kept (a virtualenv's `bin/python -> /usr/bin/python3`): it resolves inside the container,
    and gyre never follows a workspace link on the host. Ownership is gyre's, as for a `start/` copy. No such
    directory in the image: nothing."""
    import docker

    with tempfile.SpooledTemporaryFile(max_size=SEED_IN_MEMORY_BYTES) as data:  # a venv can be a GB: to disk
        container = client.containers.create(image, command=["true"], network_disabled=True)
        try:
            try:
                stream, _ = container.get_archive(workdir.rstrip("/") + "/.")
            except docker.errors.NotFound:
                return []
            for chunk in stream:
                data.write(chunk)
        finally:
            container.remove(force=True)
        data.seek(0)
        return _extract_around(data, workspace)


def _extract_around(data, workspace: Path) -> list[str]:
    """`seed_workspace`'s extraction of the image's tar stream `data` around what `workspace` already holds."""
    left_out: list[str] = []
    own_git = (workspace / ".git").exists() or (workspace / ".git").is_symlink()

    def taken(dest: str, name: str, is_dir: bool) -> bool:
        """start/ has this path, or something that is not a real directory on the way to it."""
        parts = name.split("/")
        for depth in range(1, len(parts) + 1):
            path = os.path.join(dest, *parts[:depth])
            if not os.path.lexists(path):
                return False
            if os.path.islink(path) or not os.path.isdir(path):
                return True
        return not is_dir

    def keep(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        name = member.name.removeprefix("./").rstrip("/")
        if own_git and (name == ".git" or name.startswith(".git/")):
            return None
        if taken(dest, name, member.isdir()):
            return None  # start/'s
        try:
            return tarfile.data_filter(member, dest)
        except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError) as exc:
            if member.issym():
                return tarfile.tar_filter(member, dest)
            left_out.append(f"{name} ({type(exc).__name__})")
        except tarfile.FilterError as exc:
            left_out.append(f"{name} ({type(exc).__name__})")
        return None

    with tarfile.open(fileobj=data) as archive:
        members: list[Any] = [m for m in archive.getmembers() if m.name not in (".", "./")]
        archive.extractall(workspace, members=members, filter=keep)
    return left_out
