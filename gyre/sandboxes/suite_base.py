"""A base image per Debian suite, built offline from Debian's packages: the Python a task's grader asks for.

SWE-bench's install specifications name a Python per repository and version (`swebench/harness/constants/
python.py`: marshmallow 3.0 `"python": "3.9"`, pydicom 2.3 `"3.10"`); upstream creates it with conda from the
network. No registry and no conda channel answer here, but the Debian mirror does, and it serves three suites
whose `python3` is a different minor version: bullseye 3.9, bookworm 3.11, trixie 3.13 (buster, 3.7, is gone
from it). `suite_base` builds the image of a suite the way `scripts/docker-engine.sh` builds the run's base:
`mmdebstrap --variant=essential` of a fixed package list into a tar (in a private mount namespace), then
`docker import`; tagged `gyre-base:<suite>-<digest of suite, packages and customisation>`, so a changed list
is a new image and an image already there is reused (nothing is rebuilt). The packages are what an install
specification's `pip install` needs to build what has no wheel (a compiler, Python's headers), git (the agent's
repository), and `python` for `python3` (upstream's commands say `python -m pip`). Pip's "externally managed"
marker is removed, as python.org's images have none (SWE-bench's conda environments neither).

A Python no suite serves (3.6, 3.8, 3.10, 3.12) has no base here: `suite_for` says so, and the caller makes the
instance unscorable with that reason, never a 0. Building needs root, `mmdebstrap` and `unshare` (the
`docker-engine.sh` machine's); without them `SuiteBaseError` names what is missing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SUITE_PYTHONS = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}
"""The Debian suites the package mirror serves, and the `python3` each ships."""
PACKAGES = ("python3,python-is-python3,python3-venv,python3-pip,python3-dev,python3-setuptools,python3-wheel,"
            "gcc,g++,make,libc6-dev,git,procps,ca-certificates,libstdc++6")
CUSTOMIZE = 'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED; mkdir -p "$1"/testbed'
REPOSITORY = "gyre-base"
MMDEBSTRAP_TIMEOUT_S = 1800
"""A suite's packages downloaded and unpacked (bookworm's base: ~140 s here)."""
_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


class SuiteBaseError(RuntimeError):
    """A suite's base image could not be built here; the message says why."""


def suite_for(python: str) -> str | None:
    """The suite whose `python3` is `python` ("3.9" -> bullseye), or None when no suite the mirror serves has it."""
    return next((suite for suite, version in SUITE_PYTHONS.items() if version == python), None)


def no_suite_reason(python: str) -> str:
    """Why an instance that needs `python` cannot be scored here."""
    served = ", ".join(f"{suite} {version}" for suite, version in SUITE_PYTHONS.items())
    return f"needs Python {python}, which no Debian suite the package mirror serves ships ({served})"


def _packages(extra: tuple[str, ...]) -> str:
    """mmdebstrap's `--include` list: the fixed packages, then `extra`."""
    return ",".join((PACKAGES, *extra))


def suite_tag(suite: str, extra: tuple[str, ...] = ()) -> str:
    """The tag the base of `suite` has on the engine (its digest covers suite, packages and customisation)."""
    digest = hashlib.sha256(f"{suite} {_packages(extra)} essential {CUSTOMIZE}".encode()).hexdigest()[:12]
    return f"{REPOSITORY}:{suite}-{digest}"


def suite_base(client, suite: str, timeout_s: float = MMDEBSTRAP_TIMEOUT_S,
               extra: tuple[str, ...] = ()) -> tuple[str, bool]:
    """The base image of `suite` on the engine `client` talks to, built once (concurrent callers wait for the one
    build); returns (tag, whether it was there already). `extra`: Debian packages on top of the fixed list (an
    R2E-Gym image's `apt-get install` line: Pillow's `libjpeg-dev`), a base of its own."""
    import docker

    if suite not in SUITE_PYTHONS:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITE_PYTHONS)}")
    tag = suite_tag(suite, extra)
    with _guard:
        lock = _locks.setdefault(tag, threading.Lock())
    with lock:
        try:
            client.images.get(tag)
            return tag, True
        except docker.errors.ImageNotFound:
            pass
        _build(client, suite, tag, timeout_s, extra)
    return tag, False


def _build(client, suite: str, tag: str, timeout_s: float, extra: tuple[str, ...] = ()) -> None:
    missing = [tool for tool in ("mmdebstrap", "unshare") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        raise SuiteBaseError(f"the {suite} base image ({tag}) is not on the engine and cannot be built here: "
                             + (f"{', '.join(missing)} missing" if missing else "building it needs root")
                             + " (apt-get install mmdebstrap; scripts/docker-engine.sh's machine)")
    with tempfile.TemporaryDirectory(prefix=f"gyre-{suite}-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        argv = ["unshare", "-m", "--propagation", "private", "mmdebstrap", "--quiet", "--mode=root",
                "--variant=essential", f"--customize-hook={CUSTOMIZE}", f"--include={_packages(extra)}", suite,
                str(tar)]
        hooks = Path("/usr/share/mmdebstrap/hooks/eatmydata")
        if hooks.is_dir():
            argv[5:5] = [f"--hook-dir={hooks}"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SuiteBaseError(f"mmdebstrap of {suite} took over {timeout_s:g}s") from None
        if done.returncode != 0:
            raise SuiteBaseError(f"mmdebstrap of {suite} failed (exit {done.returncode}): "
                                 f"{(done.stderr or done.stdout).strip()[-800:]}")
        repository, _, name = tag.partition(":")
        client.api.import_image_from_file(str(tar), repository=repository, tag=name, changes=['CMD ["bash"]'])
