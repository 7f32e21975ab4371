"""The engine interfaces: what the proxy needs from a rollout engine, what a step needs
from a train engine.

The torch reference engines implement them on a CPU box; SGLang (rollout) and
Megatron-core (training) implement the same interfaces on a cluster, imported only inside
their own backend modules. Nothing above this row knows which backend it talks to.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. `temperature == 0` means greedy."""

    temperature: float = 1.0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class GenerationRequest:
    """One generation. The two optional hooks let the proxy continue a request exactly on
    another engine (drain, failure) without engine-side state:

    - `stop`: once set, the engine ends this request at its next token boundary and returns
      the tokens sampled so far with `finish_reason == "abort"`.
    - `on_token(token_id, logprob)`: called (from the engine's thread, in order) for each
      token as it is sampled, so tokens survive an engine that dies mid-request.

    An engine that ignores both is still correct, just coarser: a drain then waits for its
    requests to finish, and a failure restarts the lost segment.
    """

    prompt_ids: list[int]
    params: SamplingParams
    stop: threading.Event | None = None
    on_token: Callable[[int, float], None] | None = None


@dataclass
class GenerationResult:
    """Exactly what was sampled, with the behaviour log-prob of each token under the
    temperature-scaled distribution it was drawn from."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort" (request.stop was set)
    policy_version: int
    engine_id: str


class ContextLengthError(ValueError):
    """The prompt leaves no room for a single new token."""


@runtime_checkable
class RolloutEngine(Protocol):
    engine_id: str

    @property
    def policy_version(self) -> int: ...

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Blocking and thread-safe; concurrent callers are batched together."""
        ...

    def load_weights(self, snapshot: Path, version: int) -> None:
        """Swap in the weights of `snapshot` between batches; later outputs carry `version`."""
        ...

    def close(self) -> None: ...


@dataclass
class TrainSequence:
    """One packed training row: a token sequence and, per position, what to learn.

    `trainable[i]` marks tokens the policy sampled (targets); `behaviour_logprobs[i]` is
    their rollout log-prob; `weights[i]` the loss weight from the trajectory processor.
    """

    tokens: list[int]
    trainable: list[bool]
    behaviour_logprobs: list[float]
    weights: list[float]
    advantage: float
    execution_id: str = ""


@dataclass
class TrainStats:
    loss: float
    grad_norm: float
    logprob_abs_diff: float
    tokens_trained: int
    extra: dict[str, float] = field(default_factory=dict)


class LossFn(Protocol):
    def __call__(
        self,
        logp_BT: torch.Tensor,
        behaviour_logp_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        weight_BT: torch.Tensor,
        advantage_B: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


@runtime_checkable
class TrainEngine(Protocol):
    def train_step(self, sequences: list[TrainSequence], loss_fn: LossFn) -> TrainStats:
        """Forward-backward over micro-batches, one optimizer step."""
        ...

    def save_snapshot(self, path: Path) -> Path:
        """Write the current weights for transfer to rollout engines (write, then rename)."""
        ...
