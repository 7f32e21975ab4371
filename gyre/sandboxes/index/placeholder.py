"""Placeholder wheels: what the index proxy serves for the task's own project instead of the real one.

Why. An evaluation must not install the real upstream release of the project the workspace is
meant to write (`IndexProxyConfig.denied_projects`), but an honest setup command often asks the
index for it anyway, as a dependency of something else: more-itertools' `pip install -r
requirements/development.txt` installs twine, whose keyring needs jaraco.classes, which needs
more-itertools; pytest needs packaging, pluggy and iniconfig. Upstream NL2RepoBench's image has a
network: pip installs the real release into site-packages and `PYTHONPATH=/workspace` shadows it,
so the tests import the workspace's code. Refusing the project failed that whole install in gyre
and counted the refusal as tampering (more-itertools' own release scored 0 where upstream gives
0.98, `gyre bench fidelity --image-files none`).

So the proxy answers a denied project's page with one placeholder wheel per version upstream
lists: the same versions (the client resolves the same one), each version's `requires-python`
and yanked state, and in the wheel nothing but its `.dist-info` (METADATA with no dependencies,
WHEEL, RECORD). A resolver is satisfied; nothing importable is installed, so the tests import
what the workspace wrote, as upstream's do, and a workspace that installs the project to forge
gets no code. Bytes are deterministic (fixed zip timestamps), and each listing carries the
wheel's sha256, so hash-checking clients accept them.

Limits: a client that refuses wheels (`--no-binary`) finds nothing, as it would for a denied project;
a dependency that reads the project's metadata (entry points, version-specific extras) sees the
placeholder's.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from urllib.parse import quote
from dataclasses import dataclass

from packaging.utils import (
    InvalidSdistFilename, InvalidWheelFilename, canonicalize_name, parse_sdist_filename, parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from gyre.sandboxes.index.pages import render_project_page

SUMMARY = "gyre index placeholder: the evaluated project's own distribution, without code"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Placeholder:
    """One placeholder wheel: its version, file name, bytes and the page entry (PEP 691) listing it."""

    version: Version
    filename: str
    data: bytes
    entry: dict


def file_version(filename: str) -> Version | None:
    """The version of a distribution file name (wheel or sdist), None when it parses as neither."""
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def placeholder_wheel(project: str, version: Version, requires_python: str | None = None) -> tuple[str, bytes]:
    """(file name, bytes) of the placeholder wheel of `project` at `version`: a `.dist-info` and nothing else."""
    dist = canonicalize_name(project).replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {canonicalize_name(project)}\nVersion: {version}\nSummary: {SUMMARY}\n"
    if requires_python:
        metadata += f"Requires-Python: {requires_python}\n"
    files = {f"{info}/METADATA": metadata.encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: gyre\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(_record_line(p, d) + "\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(zipfile.ZipInfo(path, _ZIP_TIME), data)
    return f"{dist}-{version}-py3-none-any.whl", out.getvalue()


def placeholders(project: str, upstream_files: list[dict], url_of) -> list[Placeholder]:
    """One placeholder per version among `upstream_files` (PEP 691 dicts of the project's real page), newest
    last, with the version's `requires-python` and yanked state taken from its files (a version is yanked only
    when all its files are); `url_of(filename)` is the link the client gets."""
    by_version: dict[Version, list[dict]] = {}
    for f in upstream_files:
        version = file_version(f.get("filename") or "")
        if version is not None:
            by_version.setdefault(version, []).append(f)
    out = []
    for version in sorted(by_version):
        files = by_version[version]
        requires = next((f["requires-python"] for f in files if f.get("requires-python")), None)
        filename, data = placeholder_wheel(project, version, requires)
        entry: dict = {"filename": filename, "url": url_of(filename),
                       "hashes": {"sha256": hashlib.sha256(data).hexdigest()}, "size": len(data)}
        if requires:
            entry["requires-python"] = requires
        if all(f.get("yanked") for f in files):
            entry["yanked"] = next((f["yanked"] for f in files if isinstance(f["yanked"], str)), True)
        out.append(Placeholder(version, filename, data, entry))
    return out


def placeholder_page(project: str, upstream_files: list[dict], prefix: str, media: str) -> tuple[list[Placeholder],
                                                                                                 bytes]:
    """(the placeholders, the page listing them in `media`) for `project`'s real files; each link is `prefix` and
    the wheel's quoted name."""
    made = placeholders(project, upstream_files, lambda name: prefix + quote(name))
    return made, render_project_page(project, [p.entry for p in made], media=media,
                                     versions=[str(p.version) for p in made])
