"""Tree attention without a dense mask: causal attention along each root-to-leaf path.

A tree-packed row (engines/base.py `TreeLayout`) needs ancestor-only attention. The
universal way is a [T, T] additive mask, which every HF causal LM accepts; but a dense
mask makes attention pay every pair of the row and loses the causal kernel's skipping, so
packing several trajectories into one row can cost more than computing them separately.

Here attention is computed per path instead: for each trajectory in the row, gather the
queries, keys and values of its positions (ancestors first, in order) and run the causal
SDPA kernel on them. A position's attention output depends only on its ancestors, so any
path through it gives the same result; each position takes it from the first path that
covers it. Projections, MLPs and the LM head still run once per unique token, and
attention costs exactly what one causal row per trajectory costs, so tree packing is never
more expensive than per-trajectory rows and saves every shared token's other work.

It is registered with transformers' `AttentionInterface` as "gyre_paths"; the paths travel
as the `gyre_paths` keyword of the model call, which HF passes down to every attention
layer. With no paths (plain right-padded rows) it is plain causal attention: right padding
never needs a mask under causal attention; a 4D mask passed by the caller is honoured. Rows
may have fewer queries than keys (a prefill on top of cached KV, a decode step): the queries
are then the last positions (`causal_attention.py`), which is how the torch rollout engine
runs its model with this attention too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from gyre.engines.torch.causal_attention import causal_attention

NAME = "gyre_paths"


@dataclass
class RowPaths:
    """The paths of one row: `paths[i]` are row positions root to leaf; `take[i]` the indices
    (into paths[i]) whose outputs path i supplies; every real position is taken once."""

    paths: list[torch.Tensor]
    take: list[torch.Tensor]
    taken_positions: torch.Tensor  # concatenation of paths[i][take[i]]


def row_paths(leaf_spans: list[list[int]], span_starts: np.ndarray, num_tokens: int) -> RowPaths:
    """Paths from the spans of each root-to-leaf chain (root first)."""
    bounds = np.append(span_starts, num_tokens)
    seen = np.zeros(num_tokens, dtype=np.bool_)
    paths, take, taken = [], [], []
    for chain in leaf_spans:
        positions = np.concatenate([np.arange(bounds[s], bounds[s + 1]) for s in chain])
        new = np.flatnonzero(~seen[positions])
        seen[positions[new]] = True
        paths.append(torch.from_numpy(positions))
        take.append(torch.from_numpy(new))
        taken.append(positions[new])
    return RowPaths(paths, take, torch.from_numpy(np.concatenate(taken)))


def leaf_chains(span_parents: np.ndarray) -> list[list[int]]:
    """Root-to-leaf span chains of a row's span forest."""
    has_child = np.zeros(len(span_parents), dtype=np.bool_)
    has_child[span_parents[span_parents >= 0]] = True
    chains = []
    for leaf in np.flatnonzero(~has_child):
        chain, s = [], int(leaf)
        while s >= 0:
            chain.append(s)
            s = int(span_parents[s])
        chains.append(chain[::-1])
    return chains


def path_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                           gyre_paths: list[RowPaths] | None = None, **kwargs):
    """query [B, H, T, D], key/value [B, Hkv, T, D] -> ([B, T, H, D], None)."""
    gqa = query.shape[1] != key.shape[1]
    if gyre_paths is None:  # plain rows (causal), or an explicit 4D mask given by the caller
        if attention_mask is not None and attention_mask.dim() == 4:
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                                 enable_gqa=gqa)
        else:  # the queries are the last positions (a prefill over cached KV has fewer queries than keys)
            out = causal_attention(query, key, value, scaling)
        return out.transpose(1, 2).contiguous(), None
    rows = []
    width = query.shape[2]
    for b, row in enumerate(gyre_paths):
        pieces = []
        for path, take in zip(row.paths, row.take):
            if not len(take):
                continue
            path, take = path.to(query.device), take.to(query.device)
            q, k, v = (t[b : b + 1].index_select(2, path) for t in (query, key, value))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa)
            pieces.append(out.index_select(2, take))
        positions = row.taken_positions
        pad = width - len(positions)
        if pad:
            pieces.append(query.new_zeros(1, query.shape[1], pad, query.shape[3]))
            rest = np.setdiff1d(np.arange(width), positions.numpy(), assume_unique=True)
            positions = torch.cat([positions, torch.from_numpy(rest)])
        inverse = torch.empty_like(positions)
        inverse[positions] = torch.arange(len(positions))
        rows.append(torch.cat(pieces, dim=2).index_select(2, inverse.to(query.device)))
    return torch.cat(rows, dim=0).transpose(1, 2).contiguous(), None


def register() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, path_attention_forward)
    return NAME
