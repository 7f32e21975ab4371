"""The engine interfaces: what the proxy needs from a rollout engine, what a step needs
from a train engine.

The torch reference engines implement them on a CPU box; SGLang (rollout) and
Megatron-core (training) implement the same interfaces on a cluster, imported only inside
their own backend modules. Nothing above this row knows which backend it talks to.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from gyre.trajectories.rows import TrainSequence


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. `temperature == 0` means greedy.

    `top_p < 1` samples from the nucleus: the most likely tokens whose probabilities (after
    temperature) first sum to at least `top_p`, renormalised; `top_k > 0` likewise keeps
    only the `top_k` most likely tokens (0: all). Behaviour log-probs are then those of the
    truncated, renormalised distribution the token was actually drawn from. The trainer
    scores tokens under the full temperature-scaled softmax, so with truncation each token's
    importance ratio carries the kept mass (ratio = mass <= 1); at the defaults (1.0, 0)
    nothing is truncated and rollout and train log-probs agree exactly.
    """

    temperature: float = 1.0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    top_p: float = 1.0
    top_k: int = 0


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
    """Read only: the engine must not change it (the proxy passes its prompt's own list, shared
    with the call's record)."""
    params: SamplingParams
    stop: threading.Event | None = None
    on_token: Callable[[int, float], None] | None = None
    affinity: str | None = None
    """A key (the proxy sets the execution's id) that an engine made of several replicas keeps on
    one replica, so a growing prompt finds its prefix cache there (`gyre.cluster.cell_ranks`);
    an engine of one replica ignores it."""


@dataclass
class GenerationResult:
    """Exactly what was sampled, with the behaviour log-prob of each token under the
    temperature-scaled (and, with top_p / top_k, truncated) distribution it was drawn from."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort" (request.stop was set)
    policy_version: int
    engine_id: str


class ContextLengthError(ValueError):
    """The prompt leaves no room for a single new token."""


class EngineDrainingError(RuntimeError):
    """The engine is draining (or drained): it takes no new requests until `resume()`.
    The proxy treats it like any failed engine and sends the request elsewhere."""


@runtime_checkable
class RolloutEngine(Protocol):
    engine_id: str

    @property
    def policy_version(self) -> int: ...

    @property
    def max_context(self) -> int:
        """Tokens the model can attend to: a prompt must be shorter (the proxy refuses longer ones)."""
        ...

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Blocking and thread-safe; concurrent callers are batched together. An engine whose
        own thread completes requests may also offer `submit` (`Submits`): the proxy then holds no
        thread of its own per call in flight."""
        ...

    def load_weights(self, snapshot: Path, version: int) -> None:
        """Swap in the weights of `snapshot` between batches; later outputs carry `version`."""
        ...

    def pause(self) -> None:
        """Finish the batch in flight, then start no new one; waiting requests stay queued."""
        ...

    def resume(self) -> None:
        """Undo `pause` or `drain`: queued and new requests run again."""
        ...

    def drain(self, timeout_s: float | None = None) -> bool:
        """Refuse new requests (EngineDrainingError), let queued and running ones finish;
        True once nothing is left (False if `timeout_s` passed first)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Submits(Protocol):
    """The optional non-blocking form of `RolloutEngine.generate`: the request is queued and a
    future returned, completed (result or error, exactly as `generate` would return or raise) by
    the engine's own thread. Errors found before queueing (`ContextLengthError`,
    `EngineDrainingError`) may be raised by `submit` itself. A caller that stops waiting stops the
    request through `request.stop`, never by cancelling the future."""

    def submit(self, request: GenerationRequest) -> Future[GenerationResult]: ...


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
        advantage_S: torch.Tensor,
        segment_BT: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """`segment_BT[b, t]` is the trajectory (0..S-1 across the micro-batch) of token (b, t),
        `advantage_S` its advantage; None means each row is one trajectory (S = B)."""
        ...


@runtime_checkable
class TrainEngine(Protocol):
    def train_step(self, sequences: list[TrainSequence], loss_fn: LossFn) -> TrainStats:
        """Forward-backward over micro-batches, one optimizer step."""
        ...

    def save_snapshot(self, path: Path) -> Path:
        """Write the current weights for transfer to rollout engines (write, then rename)."""
        ...
