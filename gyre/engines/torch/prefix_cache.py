"""A prefix cache for the torch rollout engine: the KV of earlier prompts, keyed by token ids.

An agent harness (Claude Code, the builtin agent) sends calls whose prompts grow: each call is
the previous prompt, the previous answer and a tool result. Without a cache every call prefills
its whole prompt again (~50k tokens late in a Claude Code session). With it, a call finds the
longest prefix of its prompt that an earlier call already computed, starts from that KV, and
prefills only the rest, as SGLang's RadixAttention and vLLM's prefix caching do.

The cache is a radix tree over token-id sequences: each edge holds a run of tokens and, per
layer, the keys and values of exactly those positions (`[heads, tokens, head_dim]`). A lookup
walks the tree and concatenates the segments on its path; an insert shares every node it can and
splits an edge where a new sequence diverges. Memory is bounded by a byte budget: past it, the
least recently used leaves go first (a parent is used whenever a child is, so it outlives them).
The KV depends on the weights, so a weight update must `clear()` it.

A lookup hands back the runs on its path as views (`PrefixMatch.runs`): the engine copies them
once, straight into the buffer its prefill and decode steps grow in (`kv_buffer.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer: (keys, values), each `[heads, tokens, head_dim]` (no batch dimension)."""

_CHUNK = 512  # tokens compared at once (tuple slices compare in C) before the exact position is found


@dataclass(eq=False)
class _Node:
    tokens: tuple[int, ...]
    kv: KV
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    last_used: int = 0

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)


@dataclass
class PrefixMatch:
    """The longest cached prefix of a prompt: its length and, per tree node on its path, the
    node's KV run (views into the cache, no copy; `kv` concatenates them)."""

    length: int
    runs: list[KV] = field(default_factory=list)

    @property
    def kv(self) -> KV | None:
        """The prefix's KV as one tensor per layer (a copy); None when nothing matched."""
        if not self.length:
            return None
        return [(torch.cat([run[layer][0] for run in self.runs], dim=1),
                 torch.cat([run[layer][1] for run in self.runs], dim=1)) for layer in range(len(self.runs[0]))]


class PrefixCache:
    """Radix tree of token-id prefixes and their KV, bounded by `max_bytes`, evicted LRU.

    Not thread-safe: the engine uses it from its worker thread under its batch lock."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"prefix cache budget must be positive, got {max_bytes} bytes")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hit_tokens = 0
        """Prompt tokens whose KV came from the cache (summed over lookups)."""
        self.miss_tokens = 0
        """Prompt tokens that had to be prefilled (summed over lookups)."""
        self.evicted_tokens = 0
        self.clears = 0
        self._root = _Node((), [], None)
        self._clock = 0
        self._nodes = 0

    def __len__(self) -> int:
        """Nodes (token runs) held."""
        return self._nodes

    def match(self, tokens: list[int] | tuple[int, ...], limit: int | None = None) -> PrefixMatch:
        """The longest cached prefix of `tokens[:limit]`; counts hit and miss tokens of `tokens`.
        The engine passes `limit = len(tokens) - 1` so at least one token is computed (its
        logits start the sampling)."""
        tokens = tuple(tokens)
        limit = len(tokens) if limit is None else min(limit, len(tokens))
        tick = self._tick()
        node, pos = self._root, 0
        path: list[tuple[_Node, int]] = []
        while pos < limit:
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _common_length(child.tokens, tokens, pos, limit)
            child.last_used = tick
            path.append((child, n))
            pos += n
            if n < len(child.tokens):
                break
            node = child
        self.hit_tokens += pos
        self.miss_tokens += len(tokens) - pos
        return PrefixMatch(pos, [[(k[:, :n], v[:, :n]) for k, v in seg.kv] for seg, n in path])

    def insert(self, tokens: list[int] | tuple[int, ...], kv: KV) -> None:
        """Cache `kv` (per layer `[heads, len(tokens), head_dim]`) as the KV of `tokens`. Runs
        already cached are kept (only the new tail is copied); then evicts down to the budget."""
        tokens = tuple(tokens)
        for layer, (k, v) in enumerate(kv):
            if k.shape[1] != len(tokens) or v.shape[1] != len(tokens):
                raise ValueError(
                    f"layer {layer}: KV covers {k.shape[1]}/{v.shape[1]} positions, the sequence has {len(tokens)}"
                )
        tick = self._tick()
        node, pos = self._root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                leaf = _Node(tokens[pos:], [(k[:, pos:].clone(), v[:, pos:].clone()) for k, v in kv], node)
                leaf.last_used = tick
                node.children[tokens[pos]] = leaf
                self.nbytes += leaf.nbytes
                self._nodes += 1
                break
            n = _common_length(child.tokens, tokens, pos, len(tokens))
            if n < len(child.tokens):
                child = self._split(child, n)
            child.last_used = tick
            pos += n
            node = child
        self._evict()

    def clear(self) -> None:
        """Forget everything (the weights changed, so every cached KV is stale)."""
        self._root.children = {}
        self.nbytes = 0
        self._nodes = 0
        self.clears += 1

    # -- internals ----------------------------------------------------------------------

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut `node`'s run after `n` tokens; returns the new head (the old node is its child)."""
        parent = node.parent
        assert parent is not None
        head = _Node(node.tokens[:n], [(k[:, :n].clone(), v[:, :n].clone()) for k, v in node.kv], parent)
        head.last_used = node.last_used
        node.kv = [(k[:, n:].clone(), v[:, n:].clone()) for k, v in node.kv]
        node.tokens = node.tokens[n:]
        node.parent = head
        head.children[node.tokens[0]] = node
        parent.children[head.tokens[0]] = head
        self._nodes += 1
        return head

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes and self._root.children:
            leaves = []
            stack = list(self._root.children.values())
            while stack:
                node = stack.pop()
                if node.children:
                    stack.extend(node.children.values())
                else:
                    leaves.append(node)
            oldest = min(leaves, key=lambda node: node.last_used)
            assert oldest.parent is not None
            del oldest.parent.children[oldest.tokens[0]]
            self.nbytes -= oldest.nbytes
            self.evicted_tokens += len(oldest.tokens)
            self._nodes -= 1


def _common_length(run: tuple[int, ...], tokens: tuple[int, ...], start: int, stop: int) -> int:
    """How many leading tokens of `run` equal `tokens[start:stop]`."""
    limit = min(len(run), stop - start)
    i = 0
    while i + _CHUNK <= limit and run[i : i + _CHUNK] == tokens[start + i : start + i + _CHUNK]:
        i += _CHUNK
    while i < limit and run[i] == tokens[start + i]:
        i += 1
    return i

