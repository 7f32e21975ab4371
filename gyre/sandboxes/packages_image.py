"""An NL2RepoBench task's image: the run's base with the packages its `start.md` lists, never the project itself.

Upstream tests each NL2RepoBench project in `nl2repobench/<project>:1.0`, an image whose Python holds the
project's dependencies (its `start.md` lists them) and not the project: the agent must write that. Those
images cannot be pulled here, so `packages_image` builds the stand-in FROM the run's base image
(`docker_build.task_image`: cached by digest, build steps on the build network the run chose): the packages
installed all at once, else one at a time with what still fails listed at `PACKAGES_LEFT_OUT`;
`WORKDIR /workspace`, `ENV PYTHONPATH=/workspace`, as upstream's Dockerfile. Installing the list can bring the
project itself (Jinja's list has `pallets-sphinx-themes`, whose `sphinx` requires `Jinja2`: an empty workspace
would pass the hidden tests from the image's copy), so the built image's distributions are listed (a container
of it, `python3 -I`, no network) and those `is_project` names (`evaluators.environments.own_project`, passed
in: this room does not import the evaluators) are uninstalled in a second cached step, named in the note.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from gyre.sandboxes.docker_build import BuiltImage, container_image, task_image

PACKAGES_LEFT_OUT = "/usr/local/share/gyre-image/left-out.txt"
"""In an image `packages_image` built: the requirements pip could not install there, one a line (none: empty)."""
PACKAGES_DOCKERFILE = """FROM {base}
RUN mkdir -p /usr/local/share/gyre-image && : > {left_out} && \\
    {{ python3 -m pip install --no-cache-dir --quiet {packages} || \\
      for p in {packages}; do python3 -m pip install --no-cache-dir --quiet "$p" || echo "$p" >> {left_out}; done; }}
WORKDIR {workdir}
ENV PYTHONPATH={workdir}
"""
UNINSTALL_DOCKERFILE = "FROM {base}\nRUN python3 -m pip uninstall --yes --quiet {names}\n"
LIST_DISTRIBUTIONS = """
import importlib.metadata as m, json
found = []
for d in m.distributions():
    tops = {f.parts[0].removesuffix(".py") for f in d.files or () if f.parts}
    found.append([d.metadata["Name"], sorted(t for t in tops if t.isidentifier() and not t.startswith("__"))])
print(json.dumps(found))
"""
"""Run with `python3 -I`: (name, top-level modules) of every distribution the image's Python sees."""
LIST_TIMEOUT_S = 120


def packages_image(client, task: str, base: str, packages: tuple[str, ...], workdir: str, timeout_s: float,
                   network: str = "none", index_url: str | None = None,
                   is_project: Callable[[str, list[str]], bool] | None = None) -> BuiltImage:
    """The image of task `task`: `base` with `packages`, the project itself removed (see the module docstring).
    Without packages: `base` itself, nothing built."""
    if not packages:
        return BuiltImage(base, base, cached=True)
    text = PACKAGES_DOCKERFILE.format(base=base, left_out=PACKAGES_LEFT_OUT, workdir=workdir,
                                      packages=" ".join(shlex.quote(p) for p in packages))
    built = _from_text(client, task, text, timeout_s, network, index_url)
    note = f"{base} with the {len(packages)} packages of {task}'s image" + built.note.partition(f" of {task}")[2]
    own = [name for name, modules in _distributions(client, built.tag) if is_project and is_project(name, modules)]
    if not own:
        return BuiltImage(built.tag, note, built.cached)
    removed = _from_text(client, task, UNINSTALL_DOCKERFILE.format(
        base=built.tag, names=" ".join(shlex.quote(n) for n in sorted(own))), timeout_s, "none", None)
    return BuiltImage(removed.tag, f"{note}; {', '.join(sorted(own))} removed (the project itself) as {removed.tag}",
                      built.cached and removed.cached)


def execution_image(client, task: str, image: str, dockerfile: str | None, base_images: Mapping[str, str],
                    timeout_s: float = 1800.0, network: str = "none", pull: bool = False,
                    index_url: str | None = None, packages: tuple[str, ...] = (), workdir: str = "/app",
                    is_project: Callable[[str, list[str]], bool] | None = None) -> tuple[str, str]:
    """`container_image`, then, for a task whose image holds `packages` (NL2RepoBench), `packages_image` on it
    (`is_project`: which installed distribution is the task's own project, removed again): the image an execution
    runs from and what it records. The same arguments give the same (cached) image, so the evaluation of an
    execution finds the one its agent ran in."""
    used, note, _built = container_image(client, task, image, dockerfile, base_images, timeout_s, network, pull,
                                         index_url)
    if packages:
        built = packages_image(client, task, used, packages, workdir, timeout_s, network, index_url, is_project)
        used, note = built.tag, f"{note}; {built.note}" if note != used else built.note
    return used, note


def _from_text(client, task: str, text: str, timeout_s: float, network: str, index_url: str | None) -> BuiltImage:
    """`task_image` of a Dockerfile given as text, in an otherwise empty build context."""
    with tempfile.TemporaryDirectory(prefix="gyre-packages-") as tmp:
        dockerfile = Path(tmp) / "Dockerfile"
        dockerfile.write_text(text, encoding="utf-8")
        dockerfile.chmod(0o644)  # the digest covers modes: the same under any umask
        return task_image(client, task, Path(tmp), dockerfile, {}, timeout_s, network, index_url)


def _distributions(client, image: str) -> list[tuple[str, list[str]]]:
    """(name, top-level modules) of each distribution in `image`, read in a container of it with no network."""
    output = client.containers.run(image, ["python3", "-I", "-c", LIST_DISTRIBUTIONS], remove=True,
                                   network_disabled=True, working_dir="/", labels={"gyre": "1"})
    return [(name, modules) for name, modules in json.loads(output) if name]
