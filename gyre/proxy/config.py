"""Configuration of a standalone proxy (`gyre proxy serve`), loaded from YAML under `configs/`.

Inside a run the coordinator wires the proxy itself; standalone, this says which model's
tokenizer and chat template to speak, which rollout engines to route to, and which static
keys map to which executions (a run mints keys instead). Every field has a docstring;
unknown keys and wrong types are errors that name the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gyre.config.run import ModelConfig, load_yaml_model
from gyre.proxy.gc_tuning import GC_THRESHOLD0


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class EngineSpec(Section):
    id: str
    """Engine id, recorded with every output token it samples."""
    type: Literal["torch", "sglang"] = "torch"
    """Backend: `torch` runs the reference engine in this process; `sglang` is an SGLang server
    already running at `url` (launched with `--skip-tokenizer-init` on the same model)."""
    max_batch_size: int = Field(default=32, gt=0)
    """`torch`: most concurrent calls the engine batches together."""
    seed: int = 0
    """`torch`: sampling seed of this engine."""
    device: str = "cpu"
    """`torch`: torch device of the reference engine."""
    prefix_cache_bytes: int = Field(default=2**30, ge=0)
    """`torch`: memory budget of the engine's prefix cache (the KV of earlier prompts, so an agent's
    next turn prefills only what is new); 0 turns it off. An SGLang server has its own (RadixAttention)."""
    url: str | None = None
    """`sglang`: the server's base URL, e.g. `http://127.0.0.1:30000`."""
    healthy_timeout_s: float = Field(default=300.0, gt=0)
    """`sglang`: how long the server may take to answer `/health_generate` at start."""

    @model_validator(mode="after")
    def _url_for_sglang(self) -> "EngineSpec":
        if self.type == "sglang" and not self.url:
            raise ValueError(f"engine {self.id!r}: type sglang needs `url`, the SGLang server's base URL")
        if self.type == "torch" and self.url:
            raise ValueError(f"engine {self.id!r}: `url` is for type sglang; a torch engine runs in this process")
        return self


class ProxyServeConfig(Section):
    host: Literal["127.0.0.1", "localhost", "::1"] = "127.0.0.1"
    """Interface to bind: loopback only (harnesses reach it from the same host or a tunnel)."""
    port: int = Field(default=8300, ge=0, le=65535)
    """TCP port; 0 picks a free one (printed at start)."""
    model: ModelConfig = ModelConfig()
    """The policy: its tokenizer and chat template (and the torch engines' weights)."""
    cache_dir: Path = Path(".gyre-cache")
    """Where the bundled tiny model is built (and a `pkg:` model converted) once and reused."""
    model_name: str | None = None
    """Model id served by `/v1/models` (default: the model directory's name)."""
    engines: list[EngineSpec] = Field(min_length=1)
    """Rollout engines to route to."""
    tool_parser: Literal["qwen", "hermes", "smollm2", "llama3"] = "qwen"
    """How the model writes tool calls (model family). `qwen` (Qwen2.5, Qwen3), `hermes` and `smollm2`
    read `<tool_call>` blocks holding one call object or, as SmolLM2 writes them, a list of them;
    `llama3` (Llama 3.1/3.2/3.3) reads the JSON object `{"name": ..., "parameters": {...}}`, after
    `<|python_tag|>` or not, several separated by `;` or new lines (docs/models.md)."""
    temperature: float = Field(default=1.0, gt=0.0)
    """Sampling temperature when a request does not set one."""
    force_temperature: bool = False
    """Ignore the harness's temperature and always sample at `temperature` (what RL wants)."""
    max_new_tokens: int = Field(default=1024, gt=0)
    """Tokens per call when a request does not set a limit."""
    max_new_tokens_cap: int = Field(default=8192, gt=0)
    """Upper bound on any request's token limit (Claude Code asks for 64000)."""
    max_body_bytes: int = Field(default=32 * 2**20, gt=0)
    """Largest request body accepted; larger ones get a 413 in the API's shape before the body is
    read whole. (A prompt whose text cannot fit the model's context is a 400 before templating.)"""
    max_concurrent_requests: int = Field(default=512, gt=0)
    """Engine calls in flight at once on engines that block a thread per call (`RolloutEngine.generate`:
    SGLang over HTTP, paced and Ray-cell engines); calls to an engine that takes requests without blocking
    (`engines.base.Submits`: the torch engine) are not bounded by it."""
    no_engine_wait_s: float = Field(default=120.0, ge=0)
    """How long a request waits for an engine when none is available, before a 503/529."""
    build_processes: int = Field(default=0, ge=0)
    """Worker processes that build prompts (template, splice, tokenise) and remember returned turns, each
    execution on one of them (`gyre/proxy/build_processes.py`); 0 builds them in the proxy's process. For
    many concurrent executions on a box with spare cores: the proxy's own Python then holds one GIL for HTTP,
    validation and recording only. Each call pays a process hop: on 2 cores it used the cores (1.8 of 2 at 32
    sessions) but served fewer calls per second than 0 (docs/benches.md, `gyre bench proxy-echo
    --build-processes N`)."""
    gc_threshold: int | None = Field(default=GC_THRESHOLD0, ge=700)
    """The proxy process's young garbage collections come every this many net container allocations, and what
    is alive when it starts serving is frozen out of collections (`gyre/proxy/gc_tuning.py`); None keeps Python's
    own settings (700, nothing frozen). The default served 22-24 % more calls a second at 32 agent-shaped sessions
    (`gyre bench proxy-echo` against `--python-gc`, docs/benches.md)."""
    keys: dict[str, str] = Field(default_factory=dict)
    """Static API key -> execution id (standalone use; a run mints one key per execution)."""
    record_path: Path | None = None
    """DuckDB file (`.duckdb`) every call is recorded in as it is made, in a run's call tables
    (`calls`, `call_tokens`, `call_segments`, `call_fallbacks`), at least every second; None: not kept."""

    @field_validator("record_path")
    @classmethod
    def _duckdb_file(cls, path: Path | None) -> Path | None:
        if path is not None and path.suffix != ".duckdb":
            raise ValueError(f"{path}: calls are recorded in a DuckDB file as they are made; name one ending "
                             "in .duckdb (JSON lines written at exit are no longer kept)")
        return path


def load_proxy_config(path: Path | str) -> ProxyServeConfig:
    return load_yaml_model(path, ProxyServeConfig)