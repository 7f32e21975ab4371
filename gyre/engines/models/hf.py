"""Loading a local Hugging Face causal-LM directory, with errors that say what is missing.

Both reference engines load models through here, so the bundled tiny model and any local
Qwen2/Qwen3/Llama directory follow one path. Nothing is downloaded: `local_files_only`.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path


class ModelDirError(ValueError):
    """The model directory cannot serve as a causal LM; the message names what is wrong."""


def check_model_dir(path: Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise ModelDirError(f"{path}: model directory does not exist")
    config = path / "config.json"
    if not config.is_file():
        raise ModelDirError(f"{path}: no config.json (not a Hugging Face model directory)")
    if not (list(path.glob("*.safetensors")) or list(path.glob("pytorch_model*.bin"))):
        raise ModelDirError(f"{path}: no weights (*.safetensors or pytorch_model*.bin)")
    if not ((path / "tokenizer.json").is_file() or (path / "tokenizer.model").is_file()):
        raise ModelDirError(f"{path}: no tokenizer (tokenizer.json or tokenizer.model)")
    architectures = json.loads(config.read_text()).get("architectures") or []
    if architectures and not any(a.endswith("ForCausalLM") for a in architectures):
        raise ModelDirError(f"{path}: config.json architectures {architectures} is not a causal LM")
    return path


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(check_model_dir(path), local_files_only=True)
    if not tokenizer.chat_template:
        raise ModelDirError(
            f"{path}: the tokenizer has no chat template (no chat_template.jinja, no chat_template in "
            "tokenizer_config.json); gyre renders every model call with it, so add one to the directory"
        )
    return tokenizer


_LOADING = threading.Lock()
"""transformers builds a model under process-wide state (a meta-device context while it
initialises), so two `from_pretrained` calls in parallel threads see each other's meta tensors:
parameters left on the meta device, or silently re-initialised ("newly initialized because
missing from the checkpoint"). Seen with 3 threads: every load of 30 went wrong. Live cells
build replicas and engines from worker threads, so every load takes this lock."""


def load_causal_lm(path: Path, dtype: str = "float32"):
    """Load the model in `dtype` on CPU in eval mode (the caller moves it); one load at a time."""
    import torch

    try:
        with _LOADING:  # the import too: transformers' lazy modules are not safe to import from two threads
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(
                check_model_dir(path), local_files_only=True, dtype=getattr(torch, dtype)
            )
    except ValueError as exc:  # transformers: unrecognised configuration class
        raise ModelDirError(f"{path}: not loadable as a causal LM: {exc}") from exc
    model.eval()
    return model


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """End-of-turn ids: the tokenizer's eos plus the common chat end markers it knows."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for token in ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>"):  # eom: Llama 3.1 after a tool call
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            ids.add(tid)
    return tuple(sorted(ids))
