"""KV caches that grow in place, for the torch rollout engine's prefill and decode loop.

transformers' `DynamicCache` appends by concatenation: every forward pass copies the whole
KV so far. A decode step over a 50k-token context then copies 50k positions per layer to add
one, and a prefill on top of a cached prefix copies the prefix once per chunk. Here each layer
holds a buffer allocated once for the prompt and the tokens to be sampled (`capacity`); a
forward pass writes its new positions into it and the model sees a view of the filled part.
The prefix cache's runs are copied into the buffer once (`row_cache`), and rows of a batch are
laid out left-padded in one batch buffer once (`left_padded`), so a call copies its prefix's
KV at most twice (once with a single row) however long it decodes.

A buffer that fills up grows by doubling (one copy), so a wrong capacity costs time, not
correctness. Rows whose requests have finished are dropped from a batch buffer
(`batch_select_indices`, one copy), so a batch decodes only the rows still sampling.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer: (keys, values), each `[heads, tokens, head_dim]` (no batch dimension)."""


class BufferLayer(DynamicLayer):
    """One layer's keys and values `[batch, heads, capacity, head_dim]`; `keys` / `values` are
    views of the first `length` positions (what transformers' attention reads)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = max(int(capacity), 1)
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        batch, heads, _, dim = key_states.shape
        # not zeroed: attention reads only the filled positions (`left_padded` zeroes its padding)
        self._keys = key_states.new_empty((batch, heads, self.capacity, dim))
        self._values = value_states.new_empty((batch, value_states.shape[1], self.capacity, value_states.shape[3]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            self._grow(end)
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def reset(self) -> None:
        super().reset()
        self.length = 0
        self._keys = self._values = None

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the batch rows `indices` (one copy of the buffers): the decode loop drops
        rows that have finished, so the next steps compute only the rows still sampling."""
        if self._keys is None:
            return
        self._keys = self._keys.index_select(0, indices)
        self._values = self._values.index_select(0, indices)
        self.keys, self.values = self._keys[:, :, : self.length], self._values[:, :, : self.length]

    def _unsupported(self, *args, **kwargs) -> None:
        raise NotImplementedError("a BufferLayer only grows or drops rows (the rollout engine never crops, "
                                  "reorders or offloads)")

    crop = batch_repeat_interleave = reorder_cache = offload = prefetch = _unsupported

    def _grow(self, needed: int) -> None:
        self.capacity = max(needed, 2 * self.capacity)
        keys, values = self._keys, self._values
        self._keys = keys.new_empty((*keys.shape[:2], self.capacity, keys.shape[3]))
        self._values = values.new_empty((*values.shape[:2], self.capacity, values.shape[3]))
        self._keys[:, :, : self.length] = keys[:, :, : self.length]
        self._values[:, :, : self.length] = values[:, :, : self.length]


def row_cache(num_layers: int, capacity: int, runs: list[KV] | tuple = ()) -> Cache:
    """A one-row cache with room for `capacity` positions, holding the concatenation of `runs`
    (per run and layer `[heads, tokens, head_dim]`, e.g. the prefix cache's runs), copied once."""
    cache = Cache(layers=[BufferLayer(capacity) for _ in range(num_layers)])
    for run in runs:
        for layer, (keys, values) in enumerate(run):
            cache.layers[layer].update(keys.unsqueeze(0), values.unsqueeze(0))
    return cache


def row_kv(cache: Cache, row: int, span: slice) -> KV:
    """Positions `span` of one row, per layer `[heads, tokens, head_dim]` (views, no copy)."""
    return [(layer.keys[row, :, span], layer.values[row, :, span]) for layer in cache.layers]


def left_padded(rows: list[Cache], capacity: int) -> tuple[Cache, list[int]]:
    """One-row caches of different lengths as one batch cache, each row right-aligned (left padding
    with zeros, which the decode loop's attention mask hides), with room for `capacity` positions.
    A single row is returned as it is (make its capacity right when building it). Returns the cache
    and each row's length."""
    lengths = [row.get_seq_length() for row in rows]
    if len(rows) == 1:
        return rows[0], lengths
    width = max(lengths)
    batch = Cache(layers=[BufferLayer(max(capacity, width)) for _ in rows[0].layers])
    for layer, out in enumerate(batch.layers):
        first = rows[0].layers[layer]
        out.lazy_initialization(first.keys.expand(len(rows), -1, -1, -1), first.values.expand(len(rows), -1, -1, -1))
        for r, row in enumerate(rows):
            pad = width - lengths[r]  # masked, but must be finite (0 * NaN is NaN)
            out._keys[r, :, :pad] = 0
            out._values[r, :, :pad] = 0
            out._keys[r, :, pad:width] = row.layers[layer].keys[0]
            out._values[r, :, pad:width] = row.layers[layer].values[0]
        out.length = width
        out.keys, out.values = out._keys[:, :, :width], out._values[:, :, :width]
    return batch, lengths
