"""The bundled tiny model: a Qwen3-architecture causal LM that needs no download.

A CPU box must run the whole RL path with a real model, and nothing may be fetched at run
time. So gyre builds one locally: a byte-level BPE tokenizer trained on a small built-in
corpus (agent chat turns, tool-call JSON, Python), a Qwen-style chat template with tool
calls (`<tool_call>{json}</tool_call>`), and a randomly initialised Qwen3 model from a
transformers config. It is saved as an ordinary Hugging Face model directory
(config.json, model.safetensors, tokenizer.json, chat template), so every loader in gyre
treats it exactly like any other local HF causal-LM directory.

Building is deterministic for a given `TinyModelSpec`: the same spec yields byte-identical
tokenizer files and weights, which is what makes `cached_tiny_model` safe to reuse.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

# Qwen-style template (transformers renders with trim_blocks, so a newline right after a
# block tag is written as {{ '\\n' }}): tools listed in the system turn, tool calls as JSON inside
# <tool_call> tags, tool results as a user turn wrapped in <tool_response>.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages and messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n"
    "Call a tool as <tool_call>\n{\"name\": <name>, \"arguments\": <args-object>}\n</tool_call><|im_end|>\n"
    "{% elif messages and messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' and loop.first %}"
    "{% elif message.role == 'user' or message.role == 'system' %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for tc in message.tool_calls or [] %}"
    "<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS_SNIPPETS = [
    "<|im_start|>system\nYou are a coding agent. Work in the repository and call tools.<|im_end|>\n",
    "<|im_start|>user\nCreate calc.py with a function add(a, b) that returns a + b.<|im_end|>\n",
    "<|im_start|>assistant\n<tool_call>\n"
    '{"name": "write_file", "arguments": {"path": "calc.py", "content": "def add(a, b):\\n    return a + b\\n"}}'
    "\n</tool_call><|im_end|>\n",
    "<|im_start|>assistant\n<tool_call>\n"
    '{"name": "run_shell", "arguments": {"command": "python -m pytest -q"}}\n</tool_call><|im_end|>\n',
    "<|im_start|>assistant\n<tool_call>\n"
    '{"name": "finish", "arguments": {"summary": "done"}}\n</tool_call><|im_end|>\n',
    "<|im_start|>user\n<tool_response>\nexit code 0\n</tool_response><|im_end|>\n",
    '{"type": "function", "function": {"name": "run_shell", "description": "Run a shell command", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}',
    "def greet(name):\n    return f'Hello, {name}!'\n\n\ndef is_even(n):\n    return n % 2 == 0\n",
    "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n\nVERSION = '1.2.3'\n",
    "def clamp(x, lo, hi):\n    return max(lo, min(hi, x))\n\nimport os\nimport sys\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n",
    "assert add(2, 3) == 5\nassert greet('Ada') == 'Hello, Ada!'\nprint('ok')\n",
    "The file should define the function and return the result. Write the module, then finish.\n",
]


_HASHED_ONLY_IF_CHANGED = {"rope_theta": 10_000.0}


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the bundled model. Defaults: ~0.1M parameters, fast on 2 CPU cores."""

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 262_144
    """Context length in tokens: a whole Claude Code session (~50k-token prompts) fits."""
    rope_theta: float = 10_000.0
    """RoPE base frequency (Qwen3's default; real long-context checkpoints use 1e6 and more)."""
    seed: int = 0
    corpus: tuple[str, ...] = ()
    """Extra tokenizer training text (the harness's prompts, the benchmark's instructions), so
    the text a run actually sends compresses into few tokens."""

    def digest(self) -> str:
        fields = asdict(self)
        for name, legacy in _HASHED_ONLY_IF_CHANGED.items():  # fields added later: old specs keep their hash
            if fields[name] == legacy:
                del fields[name]
        payload = json.dumps(fields, sort_keys=True) + CHAT_TEMPLATE + "".join(_CORPUS_SNIPPETS)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def build_tokenizer(vocab_size: int, corpus: tuple[str, ...] = ()):
    """Train a byte-level BPE tokenizer on the built-in corpus plus `corpus` (deterministic, < 1 s)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_CORPUS_SNIPPETS * 4 + list(corpus), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(out: Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write the tiny model directory to `out` (written elsewhere, then renamed into place)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: already exists; refusing to overwrite a model directory")
    tokenizer = build_tokenizer(spec.vocab_size, spec.corpus)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(spec.seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "gyre_tiny.json").write_text(json.dumps(asdict(spec), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def cached_tiny_model(cache_dir: Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Return the tiny model for `spec` under `cache_dir`, building it once."""
    path = Path(cache_dir) / f"tiny-qwen3-{spec.digest()}"
    if path.exists():
        return path
    try:
        return build_tiny_model(path, spec)
    except FileExistsError:  # another process built it first: theirs is identical
        return path
