"""Causal attention for queries at the end of a longer KV, without a dense mask.

A prefill on top of cached KV (the prefix cache, or an earlier prefill chunk) has fewer
queries than keys: query i is position `kv_len - q_len + i` and sees keys 0 ..
`kv_len - q_len + i`. SDPA's `is_causal` aligns the triangle top-left, which is wrong there,
so transformers builds an explicit `[q_len, kv_len]` boolean mask instead: for a 2,000-token
extension of a 50k-token session that is 100M mask entries built (slower than the attention
itself on a CPU) and read by a kernel that can then skip nothing.

Here the keys are split instead. The queries see the whole prefix (keys before the first
query), so that part needs no mask; the new block (the last `q_len` keys) is square, so that
part is plain `is_causal`. On CPU both parts run in the flash kernel, which also returns each
query's log-sum-exp, and the two partial softmaxes are merged exactly. With grouped-query
attention the prefix part (and a decode step's single query) folds the query heads that share
a KV head into one longer query block, so the prefix's keys are never repeated per head. On other devices transformers' own
`causal_lower_right` bias is used (CUDA runs it in the efficient kernel without a mask).

Used by the "gyre_paths" attention (`path_attention.py`) for rows without paths, which is
what the torch rollout engine runs its prefill and decode steps with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     scale: float | None = None) -> torch.Tensor:
    """query [B, H, Q, D], key/value [B, Hkv, K, D] with Q <= K (the queries are the last Q
    positions) -> [B, H, Q, D], each query attending to its own and every earlier position."""
    q_len, kv_len = query.shape[2], key.shape[2]
    gqa = query.shape[1] != key.shape[1]
    if q_len > kv_len:
        raise ValueError(f"{q_len} queries over {kv_len} keys: the queries must be the last keys' positions")
    if q_len == kv_len:
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale, enable_gqa=gqa)
    on_cpu = query.device.type == "cpu" and not torch.is_grad_enabled()
    if q_len == 1:  # a decode step: the last position sees every key
        if on_cpu and gqa:  # the group's heads as rows of one query block: each key is read once per group
            batch, heads, _, dim = query.shape
            folded = query.reshape(batch, key.shape[1], heads // key.shape[1], dim)
            return _flash_cpu(folded, key, value, scale=scale)[0].reshape(batch, heads, 1, dim)
        return F.scaled_dot_product_attention(query, key, value, scale=scale, enable_gqa=gqa)
    if not on_cpu:
        from torch.nn.attention.bias import causal_lower_right

        return F.scaled_dot_product_attention(query, key, value, attn_mask=causal_lower_right(q_len, kv_len),
                                              scale=scale, enable_gqa=gqa)
    return _split_cpu(query, key, value, scale)


def _split_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None) -> torch.Tensor:
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    prefix = key.shape[2] - q_len
    # the prefix: no mask; the heads of a KV group are just more queries against the same keys
    folded = query.reshape(batch, kv_heads, groups * q_len, dim)
    out_p, lse_p = _flash_cpu(folded, key[:, :, :prefix], value[:, :, :prefix], scale=scale)
    out_p = out_p.reshape(batch, heads, q_len, dim)
    lse_p = lse_p.reshape(batch, heads, q_len)
    # the new block: square, plain causal (only its q_len keys are repeated per head)
    new_k, new_v = key[:, :, prefix:], value[:, :, prefix:]
    if groups > 1:
        new_k, new_v = new_k.repeat_interleave(groups, dim=1), new_v.repeat_interleave(groups, dim=1)
    out_n, lse_n = _flash_cpu(query, new_k, new_v, is_causal=True, scale=scale)
    # softmax over both parts: each part's output weighted by its share of the total mass
    share_p = torch.sigmoid(lse_p.float() - lse_n.float()).unsqueeze(-1)
    merged = out_n.float() + (out_p.float() - out_n.float()) * share_p
    return merged.to(query.dtype)
