"""The torch reference rollout engine: batched sampling with a KV cache on any HF causal LM.

Harness executions call the proxy concurrently; each call is queued by `submit` (the proxy
awaits the returned future) or blocks in `generate`. A worker
thread collects whatever requests are waiting, runs them as one left-padded batch with a
shared KV cache, and hands each caller its exact sampled token ids and behaviour
log-probs (log-softmax of the temperature-scaled logits, the distribution the token was
drawn from; with `top_p < 1` or `top_k > 0`, of that distribution truncated to the
nucleus and renormalised, which is then what the token was drawn from; see
`SamplingParams`). Requests that arrive while a batch runs wait for the next batch
(dynamic batching; continuous batching is a later refinement behind the same interface).

Weights are swapped between batches under the same lock, so every output token carries
the policy version that actually produced it. A request whose `stop` event is set leaves
the batch at the next token boundary with the tokens it has (`finish_reason == "abort"`),
and `on_token` sees every token as it is sampled: that is what lets the proxy drain this
engine and continue each request exactly elsewhere.

Each request's prompt is prefilled on its own, starting from the KV of the longest prefix an
earlier call already computed (`PrefixCache`: an agent's next call extends its last prompt, so
only the new tokens are computed); the per-request KV is then laid out as one left-padded
batch for the decode loop, and each request's prompt and sampled tokens go into the cache.
A weight update empties it. Results are the same with and without the cache up to float
rounding (the prefix's KV was computed in a different-shaped forward pass).

The KV lives in buffers that grow in place (`kv_buffer.py`: no copy of the whole context per
decode step; a cached prefix is copied once into the row's buffer), and the model runs with
gyre's own attention (`path_attention.py`, "gyre_paths"): a prefill chunk over earlier KV
attends to the prefix without a mask and to its own block causally (`causal_attention.py`),
where transformers would build a dense `[chunk, context]` mask per chunk; the decode loop
passes a 4D padding mask only when the batch's rows differ in length. A model with
non-global attention layers (sliding windows) keeps its own attention and masks.

Engine-level control, for a scheduler that flips a cell between rollout and training:
`pause()` lets the running batch finish and holds queued requests; `drain()` also refuses
new ones (the proxy sends them elsewhere) and waits until the queued and running ones are
done; `resume()` undoes either. The sampling generator's state can be saved and restored
(`rng_state` / `set_rng_state`) so a resumed run continues the same random stream; with
concurrent callers the order in which requests consume it still depends on timing.
"""

from __future__ import annotations

import inspect
import queue
import threading
from concurrent.futures import Future
from pathlib import Path

import torch
from transformers.cache_utils import Cache

from gyre.engines.base import ContextLengthError, EngineDrainingError, GenerationRequest, GenerationResult
from gyre.engines.models.hf import load_causal_lm
from gyre.engines.torch.kv_buffer import left_padded, row_cache, row_kv
from gyre.engines.torch.path_attention import register as register_gyre_attention
from gyre.engines.torch.prefix_cache import PrefixCache
from gyre.engines.torch.sampling import BatchSampler, Rows

PREFILL_CHUNK_TOKENS = 4096
"""Prompt tokens per prefill forward pass: bounds the attention's working memory on long prompts."""

COMPACT_FRACTION = 0.75
"""The decode loop drops finished rows from the batch once at most this share of its rows still
samples (one copy of the batch's KV each time): a batch whose answers end early stops paying for them."""


class TorchRolloutEngine:
    """Reference `RolloutEngine` for CPU boxes (and small GPU tests)."""

    def __init__(
        self,
        model_dir: Path,
        engine_id: str = "torch-0",
        *,
        max_batch_size: int = 32,
        seed: int = 0,
        policy_version: int = 0,
        device: str = "cpu",
        prefix_cache_bytes: int = 2**30,
    ) -> None:
        self.engine_id = engine_id
        self.max_batch_size = max_batch_size
        self.device = torch.device(device)
        if self.device.type == "cuda":
            # cuDNN's attention builds a plan per new shape, and every decode step has a new key length: bf16
            # decoding ran 36 tokens/s with it and 328 without on an H200 (flash / memory-efficient kernels
            # instead; scripts/README.md). A process-wide switch: torch keeps SDPA backends in global flags.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.model = load_causal_lm(model_dir).to(self.device)
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 4096))
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self._num_layers = int(self.model.config.num_hidden_layers)
        layer_types = getattr(self.model.config, "layer_types", None)
        self._own_attention = (all(kind == "full_attention" for kind in layer_types) if layer_types is not None
                               else not getattr(self.model.config, "sliding_window", None))
        """gyre's attention (no dense masks; see the module docstring); False: the model's own."""
        if self._own_attention:
            self.model.config._attn_implementation = register_gyre_attention()
        # transformers renamed `past_key_values` to `cache` in 5.x; accept either.
        forward_args = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        # prefill needs the last position's logits only (a 4k-token chunk's full logits can be GBs)
        self._last_logits = {"logits_to_keep": 1} if "logits_to_keep" in forward_args else {}
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        """KV of earlier prompts (None: off); `hit_tokens` / `miss_tokens` count its effect."""
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._version = policy_version
        self._lock = threading.Lock()  # held while a batch runs or weights swap
        self._queue: queue.Queue[tuple[GenerationRequest, Future] | None] = queue.Queue()
        self._running = threading.Event()  # cleared by pause/drain: no new batch starts
        self._running.set()
        self._draining = False
        self._pending = 0  # requests queued or in a batch
        self._idle = threading.Condition()
        self._worker = threading.Thread(target=self._serve, name=f"{engine_id}-worker", daemon=True)
        self._worker.start()

    @property
    def policy_version(self) -> int:
        return self._version

    def generate(self, request: GenerationRequest) -> GenerationResult:
        return self.submit(request).result()

    def submit(self, request: GenerationRequest) -> Future:
        """`generate` without blocking (`engines.base.Submits`): the worker thread completes the future."""
        if len(request.prompt_ids) >= self.max_context:
            raise ContextLengthError(
                f"prompt has {len(request.prompt_ids)} tokens; the model's context is {self.max_context}"
            )
        future: Future = Future()
        with self._idle:
            if self._draining:
                raise EngineDrainingError(f"engine {self.engine_id} is draining")
            self._pending += 1
        future.add_done_callback(self._done)
        self._queue.put((request, future))
        return future

    def pause(self) -> None:
        self._running.clear()
        with self._lock:  # returns once the batch in flight (if any) has finished
            pass

    def resume(self) -> None:
        with self._idle:
            self._draining = False
        self._running.set()

    def drain(self, timeout_s: float | None = None) -> bool:
        with self._idle:
            self._draining = True
        self._running.set()  # a paused engine must run its queue to drain it
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def rng_state(self) -> torch.Tensor:
        with self._lock:  # never mid-batch
            return self._generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        with self._lock:
            self._generator.set_state(state)

    def _done(self, _future: Future) -> None:
        with self._idle:
            self._pending -= 1
            if self._pending == 0:
                self._idle.notify_all()

    def load_weights(self, snapshot: Path, version: int) -> None:
        """Swap in `snapshot`'s weights between batches. Every tensor's name and shape is checked
        first: a snapshot that does not fit is refused whole (ValueError naming the tensor), and
        the engine keeps serving its old weights, never a mix."""
        from safetensors.torch import load_file

        tensors = load_file(str(snapshot), device=str(self.device))
        check_fits(self.model, tensors, snapshot)
        with self._lock:
            self.model.load_state_dict(tensors, strict=False)  # strict by check_fits (tied weights may be absent)
            self._version = version
            if self.prefix_cache is not None:  # KV computed with the old weights is stale
                self.prefix_cache.clear()

    def load_snapshot(self, snapshot) -> None:
        """Swap in a verified `gyre.weights` snapshot between batches (its version with it); one
        that does not fit the model is refused whole, naming the tensor."""
        from gyre.weights.snapshot import check_fits, load_into

        check_fits(snapshot, self.model)
        with self._lock:
            load_into(self.model, snapshot, verify=False)  # a pull verified its checksum
            self._version = snapshot.version
            if self.prefix_cache is not None:
                self.prefix_cache.clear()

    def close(self) -> None:
        self._running.set()
        self._queue.put(None)
        self._worker.join(timeout=10)

    # -- worker -------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if not item[1].set_running_or_notify_cancel():  # cancelled by its submitter while queued
                continue
            self._acquire_running()
            try:
                batch = [item]
                while len(batch) < self.max_batch_size:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        self._queue.put(None)
                        break
                    if nxt[1].set_running_or_notify_cancel():
                        batch.append(nxt)
                try:
                    results = self._generate_batch([req for req, _ in batch])
                except BaseException as exc:  # hand the failure to every waiting caller
                    for _, fut in batch:
                        fut.set_exception(exc)
                    continue
            finally:
                self._lock.release()
            for (_, fut), result in zip(batch, results):
                fut.set_result(result)

    def _acquire_running(self) -> None:
        """Take the batch lock while not paused (pause clears the flag, then takes the lock)."""
        while True:
            self._running.wait()
            self._lock.acquire()
            if self._running.is_set():
                return
            self._lock.release()

    @torch.no_grad()
    def _generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        num_rows = len(requests)
        lengths = [len(r.prompt_ids) for r in requests]
        budgets = [min(r.params.max_new_tokens, self.max_context - n) for r, n in zip(requests, lengths)]
        sampler = BatchSampler(requests, self.device)
        rows = Rows(requests, budgets)
        if rows.all_done():
            return rows.results(self._result)

        room = max(max(budgets), 0)  # decode positions the batch buffer needs
        prefilled = [self._prefill(req.prompt_ids, n + room if num_rows == 1 else n) for req, n in zip(requests, lengths)]
        width = max(lengths)
        past, _ = left_padded([cache for cache, _ in prefilled], width + room)
        attention_BL = torch.zeros((num_rows, width + room), dtype=torch.long, device=self.device)
        for row, n in enumerate(lengths):
            attention_BL[row, width - n :] = 1
        padded = min(lengths) < width
        next_pos_B = torch.tensor(lengths, dtype=torch.long, device=self.device)
        logits_BV = torch.stack([logits_V for _, logits_V in prefilled])
        del prefilled
        fed = 0  # decode steps whose tokens went through the model (their KV is in `past`)
        live = list(range(num_rows))  # the request row of each batch row still in the batch
        while True:
            tokens_B, token_logp_B = sampler.sample(logits_BV, self._generator)
            rows.accept(tokens_B.tolist(), token_logp_B.tolist(), live)
            if rows.all_done():
                break
            keep = [i for i, row in enumerate(live) if not rows.done[row]]
            if len(keep) <= COMPACT_FRACTION * len(live):  # drop finished rows: later steps compute only the rest
                for i, row in enumerate(live):
                    if rows.done[row]:
                        self._remember(requests[row], rows.outputs[row], past, i, width - lengths[row], width, fed)
                index = torch.tensor(keep, dtype=torch.long, device=self.device)
                past.batch_select_indices(index)
                sampler.select(index)
                tokens_B, attention_BL, next_pos_B = tokens_B[index], attention_BL[index], next_pos_B[index]
                live = [live[i] for i in keep]
                padded = bool((attention_BL[:, :width] == 0).any())
            out = self.model(
                input_ids=tokens_B.unsqueeze(-1),
                attention_mask=self._decode_mask(attention_BL[:, : width + fed + 1], padded),
                position_ids=next_pos_B.unsqueeze(-1),
                use_cache=True,
                **{self._cache_arg: past},
            )
            past = out[self._cache_arg]
            fed += 1
            next_pos_B = next_pos_B + 1
            logits_BV = out.logits[:, -1, :].float()
        for i, row in enumerate(live):
            self._remember(requests[row], rows.outputs[row], past, i, width - lengths[row], width, fed)
        return rows.results(self._result)

    def _remember(self, request: GenerationRequest, output: list[int], past: Cache, index: int, start: int,
                  width: int, fed: int) -> None:
        """Put one batch row's prompt and sampled tokens (those whose KV was computed) into the
        prefix cache: the next call of an execution extends prompt + answer."""
        if self.prefix_cache is None:
            return
        n = min(len(output), fed)
        self.prefix_cache.insert(list(request.prompt_ids) + output[:n], row_kv(past, index, slice(start, width + n)))

    def _prefill(self, prompt_ids: list[int], capacity: int) -> tuple[Cache, torch.Tensor]:
        """One prompt's KV (a one-row cache with room for `capacity` positions) and its last
        position's logits, computed on top of the longest cached prefix (at least the last token
        is computed)."""
        hit = self.prefix_cache.match(prompt_ids, len(prompt_ids) - 1) if self.prefix_cache is not None else None
        start = hit.length if hit is not None else 0
        cache = row_cache(self._num_layers, capacity, hit.runs if start else [])
        ids = torch.tensor(prompt_ids, dtype=torch.long, device=self.device)
        # The last token always goes alone: whether the rest came from the cache or not, its
        # forward pass has the same shapes, so a repeated prompt gives bit-identical log-probs.
        last = len(prompt_ids) - 1
        edges = [*range(start, last, PREFILL_CHUNK_TOKENS), last, last + 1]
        for begin, end in zip(edges, edges[1:]):
            out = self.model(
                input_ids=ids[None, begin:end],
                attention_mask=None if self._own_attention else torch.ones((1, end), dtype=torch.long, device=self.device),
                position_ids=torch.arange(begin, end, device=self.device)[None],
                use_cache=True,
                **{self._cache_arg: cache},
                **self._last_logits,
            )
        if self.prefix_cache is not None:
            self.prefix_cache.insert(prompt_ids, row_kv(cache, 0, slice(0, len(prompt_ids))))
        return cache, out.logits[0, -1, :].float()

    def _decode_mask(self, attention_BL: torch.Tensor, padded: bool) -> torch.Tensor | None:
        """The decode step's attention mask over the positions so far: gyre's attention needs one
        only for left padding (a `[rows, 1, 1, positions]` boolean mask); the model's own takes the 2D mask."""
        if not self._own_attention:
            return attention_BL
        return attention_BL[:, None, None, :].bool() if padded else None

    def _result(self, output_ids: list[int], logprobs: list[float], finish_reason: str) -> GenerationResult:
        return GenerationResult(output_ids, logprobs, finish_reason, self._version, self.engine_id)


def check_fits(model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: Path) -> None:
    """`tensors` load into `model` whole: the same names (a tied weight may be absent) and shapes."""
    expected = model.state_dict()
    unknown = sorted(set(tensors) - set(expected))
    if unknown:
        raise ValueError(f"snapshot {source}: tensor {unknown[0]!r} is not in the model"
                         + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(f"snapshot {source}: tensor {name!r} has shape {tuple(tensor.shape)}, the model's is "
                             f"{tuple(expected[name].shape)}")
    aliases: dict[int, list[str]] = {}  # a tied weight is saved once, under any one of its names
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    alias_of = {name: names for names in aliases.values() for name in names}
    missing = sorted(n for n in expected if not any(a in tensors for a in alias_of.get(n, [n])))
    if missing:
        raise ValueError(f"snapshot {source}: tensor {missing[0]!r} is missing"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
