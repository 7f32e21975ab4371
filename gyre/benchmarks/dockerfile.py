"""What a Terminal-Bench or Harbor task's Dockerfile installs with pip: its image's Python packages.

The verifier's tests run in the task's image, so they may import what the Dockerfile installed
(`RUN pip install numpy==2.3.0` for largest-eigenval, whose tests import numpy). Without the image
(the local sandbox), the evaluation installs the same requirements from the package index before the
tests run (`TaskSpec.image_packages`, as NL2RepoBench's `start.md` packages are). Read here: every
`pip install` / `pip3 install` / `python -m pip install` / `uv pip install` of a RUN instruction
(continuation lines joined), its named requirements only: options and their values, requirement
files, local paths and URLs are left out (they name nothing the index serves), and so are pip and
wheel (the evaluation's own tools; NL2RepoBench's packages leave them out too).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

_RUN = re.compile(r"^\s*RUN\s+(.*)$", re.I | re.M)
_INSTALL = re.compile(r"(?:^|\s)(?:pip3?|python3?(?:\.\d+)?\s+-m\s+pip|uv\s+pip)\s+install\s+(.*)$")
TOOLS = frozenset({"pip", "wheel"})
_VALUED = frozenset({"-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-f",
                     "--find-links", "-t", "--target", "--prefix", "--root", "--python", "-e", "--editable",
                     "--platform", "--python-version", "--implementation", "--abi", "--trusted-host"})


def pip_packages(dockerfile: Path) -> tuple[str, ...]:
    """The requirements the Dockerfile's RUN instructions pip-install, in order, each once; () without one."""
    if not Path(dockerfile).is_file():
        return ()
    text = Path(dockerfile).read_text(encoding="utf-8", errors="replace").replace("\\\n", " ")
    found: list[str] = []
    for run in _RUN.findall(text):
        for part in re.split(r"&&|\|\||;|\|", run):
            match = _INSTALL.search(part)
            if match:
                found += [r for r in _requirements(match.group(1)) if r not in found]
    return tuple(found)


def _requirements(args: str) -> list[str]:
    try:
        words = shlex.split(args)
    except ValueError:
        words = args.split()
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in _VALUED:
            skip = True
        elif word.startswith("-") or word.startswith((".", "/", "$", "~")) or "://" in word or \
                word.endswith((".txt", ".whl", ".tar.gz", ".zip")):
            continue
        else:
            try:
                name = canonicalize_name(Requirement(word).name)
            except InvalidRequirement:
                continue
            if name not in TOOLS:
                out.append(word)
    return out
