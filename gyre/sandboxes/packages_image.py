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
in: this room does not import the evaluators) are removed in a second cached step, named in the note: wherever
they are installed, the base's Debian copies included (the Debian base's pytest brings `more-itertools` 8.10:
an empty more-itertools workspace scored 0.76 in its image), the build failing if one still imports.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from gyre.sandboxes.docker_build import BuiltImage, container_image, task_image
from gyre.sandboxes.swe_image import EnvironmentRecipe, instance_image

PACKAGES_LEFT_OUT = "/usr/local/share/gyre-image/left-out.txt"
"""In an image `packages_image` built: the requirements pip could not install there, one a line (none: empty)."""
PACKAGES_DOCKERFILE = """FROM {base}
RUN mkdir -p /usr/local/share/gyre-image && : > {left_out} && \\
    {{ python3 -m pip install --no-cache-dir --quiet {packages} || \\
      for p in {packages}; do python3 -m pip install --no-cache-dir --quiet "$p" || echo "$p" >> {left_out}; done; }}
WORKDIR {workdir}
ENV PYTHONPATH={workdir}
"""
UNINSTALL_DOCKERFILE = """FROM {base}
COPY remove_project.py /tmp/gyre-remove-project.py
RUN python3 -m pip uninstall --yes --quiet {names} 2>/dev/null; python3 -I /tmp/gyre-remove-project.py {names} && \
    rm /tmp/gyre-remove-project.py
"""
REMOVE_PROJECT = """
import importlib.metadata as m, importlib.util, os, re, shutil, sys
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
wanted, left = {norm(n) for n in sys.argv[1:]}, set()
for d in list(m.distributions()):
    name = d.metadata["Name"]
    if not name or norm(name) not in wanted:
        continue
    tops = {f.parts[0].removesuffix(".py") for f in d.files or () if f.parts}
    tops |= set((d.read_text("top_level.txt") or "").split())
    base = str(d.locate_file(""))
    for top in sorted(t for t in tops if t.isidentifier() and not t.startswith("__")):
        left.add(top)
        for path in (os.path.join(base, top), os.path.join(base, top + ".py")):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
    meta = getattr(d, "_path", None)
    if meta is not None and os.path.isdir(meta):
        shutil.rmtree(meta)
    print("gyre: removed", name, "from", base)
still = sorted(t for t in left if importlib.util.find_spec(t) is not None)
if still:
    sys.exit("gyre: still importable after the project's removal: " + ", ".join(still))
"""
"""Removes the named distributions wherever they are installed, Debian's own copies included (`pip uninstall`
cannot: they have no RECORD), and fails the build if one of their modules is still importable."""
LIST_DISTRIBUTIONS = """
import importlib.metadata as m, json
found = []
for d in m.distributions():
    tops = {f.parts[0].removesuffix(".py") for f in d.files or () if f.parts}
    found.append([d.metadata["Name"], sorted(t for t in tops if t.isidentifier() and not t.startswith("__"))])
print(json.dumps(found))
"""
"""Run with `python3 -I`: (name, top-level modules) of every distribution the image's Python sees."""
_listed: dict[str, list[tuple[str, list[str]]]] = {}
_listed_lock = threading.Lock()


def packages_image(client, task: str, base: str, packages: tuple[str, ...], workdir: str, timeout_s: float,
                   network: str = "none", index_url: str | None = None,
                   is_project: Callable[[str, list[str]], bool] | None = None) -> BuiltImage:
    """The image of task `task`: `base` with `packages`, the project itself removed (see the module docstring);
    its note says what was done on top of `base` (empty: nothing, the image is `base`)."""
    built, notes = BuiltImage(base, "", cached=True), []
    if packages:
        text = PACKAGES_DOCKERFILE.format(base=base, left_out=PACKAGES_LEFT_OUT, workdir=workdir,
                                          packages=" ".join(shlex.quote(p) for p in packages))
        built = _from_text(client, task, text, timeout_s, network, index_url)
        notes.append(f"with the {len(packages)} packages of {task}'s image" + built.note.partition(f" of {task}")[2])
    own = sorted(name for name, modules in _distributions(client, built.tag) if is_project(name, modules)) \
        if is_project is not None else []
    if own:
        removed = _from_text(client, task, UNINSTALL_DOCKERFILE.format(
            base=built.tag, names=" ".join(shlex.quote(n) for n in own)), timeout_s, "none", None,
            {"remove_project.py": REMOVE_PROJECT})
        notes.append(f"{', '.join(own)} removed (the project itself) as {removed.tag}")
        built = BuiltImage(removed.tag, "", built.cached and removed.cached)
    return BuiltImage(built.tag, "; ".join(notes), built.cached)


def execution_image(client, task: str, image: str, dockerfile: str | None, base_images: Mapping[str, str],
                    timeout_s: float = 1800.0, network: str = "none", pull: bool = False,
                    index_url: str | None = None, packages: tuple[str, ...] = (), workdir: str = "/app",
                    is_project: Callable[[str, list[str]], bool] | None = None,
                    recipe: EnvironmentRecipe | None = None) -> tuple[str, str]:
    """A SWE-bench instance's image when there is a `recipe` (`swe_image.instance_image`); else `container_image`, then, for an NL2RepoBench task (`packages` its image holds, `is_project` which installed
    distribution is its own project), `packages_image` on it: the image an execution runs from and what it records.
    The same arguments give the same (cached) image, so the evaluation of an execution finds the one its agent ran
    in."""
    if recipe is not None:
        built = instance_image(client, recipe, timeout_s, network, index_url)
        return built.tag, built.note
    used, note, _built = container_image(client, task, image, dockerfile, base_images, timeout_s, network, pull,
                                         index_url)
    if packages or is_project is not None:
        built = packages_image(client, task, used, packages, workdir, timeout_s, network, index_url, is_project)
        if built.note:
            used, note = built.tag, f"{note} {built.note}"
    return used, note


def _from_text(client, task: str, text: str, timeout_s: float, network: str, index_url: str | None,
               files: Mapping[str, str] | None = None) -> BuiltImage:
    """`task_image` of a Dockerfile given as text, in a build context holding only `files` (name -> text)."""
    with tempfile.TemporaryDirectory(prefix="gyre-packages-") as tmp:
        for name, content in {"Dockerfile": text, **(files or {})}.items():
            path = Path(tmp) / name
            path.write_text(content, encoding="utf-8")
            path.chmod(0o644)  # the digest covers modes: the same under any umask
        dockerfile = Path(tmp) / "Dockerfile"
        return task_image(client, task, Path(tmp), dockerfile, {}, timeout_s, network, index_url)


def _distributions(client, image: str) -> list[tuple[str, list[str]]]:
    """(name, top-level modules) of each distribution in `image`, read in a container of it with no network (once
    per image id in this process: every execution and evaluation of a task asks)."""
    key = client.images.get(image).id
    with _listed_lock:
        if key in _listed:
            return _listed[key]
    output = client.containers.run(image, ["python3", "-I", "-c", LIST_DISTRIBUTIONS], remove=True,
                                   network_disabled=True, working_dir="/", labels={"gyre": "1"})
    found = [(name, modules) for name, modules in json.loads(output) if name]
    with _listed_lock:
        _listed[key] = found
    return found
