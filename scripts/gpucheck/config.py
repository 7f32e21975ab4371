"""What the GPU check measures against: its sections, time limits, tolerances and sizes.

Every number a reader may want to change before a run (a section's limit, an expected gap, the
model's size) in one place, so the section modules hold only the checks themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # scripts/gpucheck/config.py -> the repository root

SECTIONS: tuple[tuple[str, str], ...] = (
    ("env", "(a) environment"),
    ("rollout", "(b) rollout engine bf16 vs fp32"),
    ("train", "(c) torch train engine bf16 vs fp32"),
    ("megatron", "(d) megatron engine vs torch fp32"),
    ("switch", "(e) role switches vs bound"),
    ("transports", "(f) weight transports"),
)

# Section time limits (seconds), each also cut to what is left of the global budget.
SECTION_LIMITS = {"env": 60, "rollout": 45, "train": 40, "megatron": 60, "switch": 50, "transports": 60}
WATCHDOG_GRACE_S = 15.0  # past the budget by this much, the watchdog prints what it has and exits

# Expected gaps (what counts as "ok"); beyond them a row says "CHECK".
TOL_FP32_TITO = 1e-3  # fp32 rollout log-probs vs fp32 full-forward re-scoring (KV cache vs none)
TOL_BF16_LOGPROB = 0.1  # bf16 vs fp32 log-probs of the same tokens (bf16 logits err ~ 2^-8 relative)
TOL_BF16_LOSS_REL = 2e-2
TOL_BF16_GRAD_REL = 0.1
TOL_MEGATRON_REL = 1e-4  # fp32, two implementations of the same model (tests: 1e-4 absolute)
SWITCH_BOUND_CONST_S = 0.5
SWITCH_BOUND_FACTOR = 3.0

NOT_DEVICE_MODULES = ("duckdb", "prefect", "pydantic", "starlette", "fastapi", "uvicorn", "ray", "polars")
"""Top-level modules the device image may lack or that gyre's engine path must not need."""


@dataclass(frozen=True)
class Sizes:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    prompts: int  # rollout prompts, generated as one batch
    prompt_tokens: int
    new_tokens: int
    train_rows: int  # plain rows of the packed micro-batch (plus one tree-packed row)
    train_tokens: int  # tokens of the longest row
    repeats: int  # timed repetitions (median reported)


GPU_SIZES = Sizes(1024, 3072, 8, 16, 8, 64, 512, prompts=8, prompt_tokens=256, new_tokens=32,
                  train_rows=6, train_tokens=512, repeats=3)
CPU_SIZES = Sizes(64, 192, 2, 4, 2, 16, 512, prompts=2, prompt_tokens=12, new_tokens=6,
                  train_rows=2, train_tokens=24, repeats=2)
_TINY_OVERRIDES = {"prompts": 2, "prompt_tokens": 8, "new_tokens": 4, "train_rows": 1, "train_tokens": 16, "repeats": 1}
