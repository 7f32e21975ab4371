"""The torch reference train engine: forward-backward on packed rows, AdamW, snapshots.

Rows are plain (one trajectory, causal) or tree-packed (a `TreeLayout`: ancestor-only
attention as a 4D additive float mask, depth position ids, each token scored at its parent
token; HF causal LMs such as Qwen3 take both). It recomputes each target token's log-prob
under the current weights with the same temperature scaling the rollout engine sampled
with, hands the per-token tensors to the algorithm's loss (the engine never knows which objective it runs), accumulates gradients
over micro-batches bounded by a token budget, clips the global grad norm and takes one
AdamW step. `logprob_abs_diff` is measured in the same forward pass, before the update:
the gap between trainer and behaviour log-probs on trained tokens, which must stay near
zero for TITO to be honest.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from gyre.algo.gspo import is_summed
from gyre.engines.base import LossFn, TrainStats
from gyre.engines.models.hf import load_causal_lm
from gyre.engines.torch.path_attention import RowPaths, leaf_chains, row_paths
from gyre.engines.torch.path_attention import register as register_path_attention
from gyre.trajectories.rows import TrainSequence, TreeLayout


class NonFiniteError(FloatingPointError):
    """Loss or gradients were NaN/inf; the optimizer step was not taken."""


def token_logprobs(
    model,
    input_ids_BT: torch.Tensor,
    attention: torch.Tensor,
    temperature: float,
    position_ids_BT: torch.Tensor | None = None,
    prev_BT: torch.Tensor | None = None,
    **model_kwargs,
):
    """log p(token[t] | its context), shape [B, T]; 0 where a token has no predecessor.

    Plain rows: `attention` is the [B, T] padding mask and token t is predicted at t - 1.
    Tree rows: `attention` is a [B, 1, T, T] additive float mask (or None with the
    "gyre_paths" attention and its `gyre_paths` keyword), `position_ids_BT` are depths, and
    token t is predicted at `prev_BT[b, t]` (its parent token in the tree; -1 for none).
    """
    logits_BTV = model(
        input_ids=input_ids_BT, attention_mask=attention, position_ids=position_ids_BT, use_cache=False,
        **model_kwargs,
    ).logits.float()
    if temperature > 0:
        logits_BTV = logits_BTV / temperature
    if prev_BT is None:
        logp_BTV = torch.log_softmax(logits_BTV[:, :-1], dim=-1)
        target_logp = logp_BTV.gather(-1, input_ids_BT[:, 1:].unsqueeze(-1)).squeeze(-1)
        return torch.nn.functional.pad(target_logp, (1, 0))
    rows, width, vocab = logits_BTV.shape
    logp_NV = torch.log_softmax(logits_BTV, dim=-1).reshape(rows * width, vocab)
    row_offset_B1 = torch.arange(rows, device=prev_BT.device).unsqueeze(-1) * width
    at_N = (prev_BT.clamp(min=0) + row_offset_B1).reshape(-1)
    target_logp = logp_NV[at_N, input_ids_BT.reshape(-1)].reshape(rows, width)
    return torch.where(prev_BT >= 0, target_logp, torch.zeros_like(target_logp))


def micro_batches(sequences: list[TrainSequence], token_budget: int) -> list[list[TrainSequence]]:
    """Group rows (in order) so that rows x padded width stays within `token_budget`."""
    batches: list[list[TrainSequence]] = []
    current: list[TrainSequence] = []
    width = 0
    for seq in sequences:
        new_width = max(width, len(seq.tokens))
        if current and new_width * (len(current) + 1) > token_budget:
            batches.append(current)
            current, new_width = [], len(seq.tokens)
        current.append(seq)
        width = new_width
    if current:
        batches.append(current)
    return batches


def _tree_structure(seq: TrainSequence, width: int, dense: bool = True) -> tuple:
    """(allowed [width, width] bool or None, position ids [width], predecessor index [width]).

    A plain row is one root span. Padding attends only to itself (no all-masked rows, so no
    NaN), has position 0 and no predecessor.
    """
    n = len(seq.tokens)
    layout = seq.tree or TreeLayout(np.zeros(1, np.int64), np.full(1, -1, np.int64), np.arange(n))
    starts = np.asarray(layout.span_starts_S, dtype=np.int64)
    parents = np.asarray(layout.span_parent_S, dtype=np.int64)
    num_spans = len(starts)
    lengths = np.diff(np.append(starts, n))
    allowed = None
    if dense:
        ancestor_SS = np.zeros((num_spans, num_spans), dtype=np.bool_)
        for s_, parent in enumerate(parents):
            if parent >= 0:
                ancestor_SS[s_] = ancestor_SS[parent]
            ancestor_SS[s_, s_] = True
        span_T = np.repeat(np.arange(num_spans), lengths)
        allowed = np.zeros((width, width), dtype=np.bool_)
        allowed[:n, :n] = ancestor_SS[span_T[:, None], span_T[None, :]] & np.tri(n, dtype=np.bool_)
        pad = np.arange(n, width)
        allowed[pad, pad] = True
    positions = np.zeros(width, dtype=np.int64)
    positions[:n] = layout.position_ids_T
    prev = np.full(width, -1, dtype=np.int64)
    prev[:n] = np.arange(n) - 1
    span_prev = np.where(parents >= 0, np.append(starts, n)[np.maximum(parents, 0) + 1] - 1, -1)
    prev[starts[lengths > 0]] = span_prev[lengths > 0]
    return allowed, positions, prev


def _collate(batch: list[TrainSequence], pad_id: int, tree_attention: str = "mask") -> dict[str, torch.Tensor]:
    """Tensors of one micro-batch (`tree_attention`: "mask" builds a dense 4D mask for tree
    rows, "paths" leaves attention to engines/path_attention.py). Segments (trajectories, for the GSPO sequence ratio) are
    numbered across the micro-batch: a plain row is one segment, a tree row brings its own."""
    width = max(len(s.tokens) for s in batch)
    rows = len(batch)
    out = {
        "input_ids": torch.full((rows, width), pad_id, dtype=torch.long),
        "attention": torch.zeros((rows, width), dtype=torch.long),
        "mask": torch.zeros((rows, width), dtype=torch.bool),
        "behaviour": torch.zeros((rows, width), dtype=torch.float32),
        "weight": torch.zeros((rows, width), dtype=torch.float32),
        "segment": torch.full((rows, width), -1, dtype=torch.long),
    }
    advantages: list[float] = []
    for row, seq in enumerate(batch):
        n = len(seq.tokens)
        out["input_ids"][row, :n] = torch.as_tensor(np.asarray(seq.tokens), dtype=torch.long)
        out["attention"][row, :n] = 1
        out["mask"][row, :n] = torch.as_tensor(np.asarray(seq.trainable, dtype=np.bool_))
        out["behaviour"][row, :n] = torch.as_tensor(np.asarray(seq.behaviour_logprobs, dtype=np.float32))
        out["weight"][row, :n] = torch.as_tensor(np.asarray(seq.weights, dtype=np.float32))
        if seq.segment_ids is None:
            out["segment"][row, :n] = len(advantages)
            advantages.append(seq.advantage)
        else:
            local = torch.as_tensor(np.asarray(seq.segment_ids, dtype=np.int64))
            out["segment"][row, :n] = torch.where(local >= 0, local + len(advantages), local)
            seg_adv = seq.segment_advantages
            advantages.extend(seg_adv if seg_adv is not None else [seq.advantage] * seq.num_segments)
    out["advantage"] = torch.tensor(advantages, dtype=torch.float32)
    if tree_attention == "paths":
        out["attention"] = None  # causal; right padding needs no mask
    if any(s.tree is not None for s in batch):
        structures = [_tree_structure(seq, width, dense=tree_attention == "mask") for seq in batch]
        out["position_ids"] = torch.from_numpy(np.stack([p for _, p, _ in structures]))
        out["prev"] = torch.from_numpy(np.stack([q for _, _, q in structures]))
        if tree_attention == "paths":
            out["gyre_paths"] = [_paths(seq) for seq in batch]
            return out
        allowed = torch.from_numpy(np.stack([a for a, _, _ in structures])).unsqueeze(1)
        mask_B1TT = torch.zeros(allowed.shape, dtype=torch.float32)
        out["attention"] = mask_B1TT.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return out


def _paths(seq: TrainSequence) -> RowPaths:
    n = len(seq.tokens)
    if seq.tree is None:
        return row_paths([[0]], np.zeros(1, np.int64), n)
    parents = np.asarray(seq.tree.span_parent_S, dtype=np.int64)
    return row_paths(leaf_chains(parents), np.asarray(seq.tree.span_starts_S, dtype=np.int64), n)


def _check(seq: TrainSequence) -> None:
    n = len(seq.tokens)
    name = f"sequence of execution {seq.execution_id!r}"
    if not (len(seq.trainable) == len(seq.behaviour_logprobs) == len(seq.weights) == n):
        raise ValueError(f"{name}: per-token arrays differ in length")
    if seq.segment_ids is not None:
        segment_ids = np.asarray(seq.segment_ids)
        if len(segment_ids) != n:
            raise ValueError(f"{name}: segment_ids has {len(segment_ids)} entries for {n} tokens")
        if (segment_ids[np.asarray(seq.trainable, dtype=np.bool_)] < 0).any():
            raise ValueError(f"{name}: a trainable token has no segment")
        if seq.segment_advantages is not None and len(seq.segment_advantages) < seq.num_segments:
            raise ValueError(f"{name}: fewer segment advantages than segments")
    if seq.tree is not None:
        starts, parents = np.asarray(seq.tree.span_starts_S), np.asarray(seq.tree.span_parent_S)
        if len(starts) != len(parents) or not len(starts) or starts[0] != 0 or (np.diff(starts) < 0).any():
            raise ValueError(f"{name}: tree spans must start at 0, in order, one parent each")
        if (parents >= np.arange(len(parents))).any():
            raise ValueError(f"{name}: a tree span's parent must come before it")
        if len(seq.tree.position_ids_T) != n:
            raise ValueError(f"{name}: position_ids has {len(seq.tree.position_ids_T)} entries for {n} tokens")


def freeze_below(model: torch.nn.Module, trainable_layers: int) -> None:
    """Train only the top `trainable_layers` decoder layers and the final norm (`train.trainable_layers`); the
    embedding (and a head tied to it) and the layers below stay as loaded, so the backward pass stops at the
    lowest trained layer. ValueError for a model without the `model.layers` / `model.norm` layout."""
    inner = getattr(model, "model", None)
    layers, norm = getattr(inner, "layers", None), getattr(inner, "norm", None)
    if layers is None or norm is None:
        raise ValueError(f"train.trainable_layers needs a decoder with model.layers and model.norm "
                         f"({type(model).__name__} has not)")
    if not 0 < trainable_layers <= len(layers):
        raise ValueError(f"train.trainable_layers {trainable_layers} must be in 1..{len(layers)} (the model's layers)")
    model.requires_grad_(False)
    for module in [*layers[len(layers) - trainable_layers:], norm]:
        module.requires_grad_(True)


class TorchTrainEngine:
    """Reference `TrainEngine`: one full replica of the model and its AdamW state."""

    def __init__(
        self,
        model_dir: Path,
        *,
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        grad_clip: float = 1.0,
        micro_batch_tokens: int = 8192,
        temperature: float = 1.0,
        seed: int = 0,
        device: str = "cpu",
        tree_attention: Literal["paths", "mask"] = "paths",
        trainable_layers: int | None = None,
    ) -> None:
        torch.manual_seed(seed)
        self.device = torch.device(device)
        self.model = load_causal_lm(model_dir).to(self.device)
        if trainable_layers is not None:
            freeze_below(self.model, trainable_layers)
        if tree_attention not in ("paths", "mask"):
            raise ValueError(f"tree_attention must be 'paths' or 'mask', got {tree_attention!r}")
        self.tree_attention = tree_attention
        if tree_attention == "paths":
            self.model.config._attn_implementation = register_path_attention()
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.grad_clip = grad_clip
        self.micro_batch_tokens = micro_batch_tokens
        self.temperature = temperature
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=lr, betas=betas, weight_decay=weight_decay
        )
        self.steps_taken = 0

    @property
    def pair_cost(self) -> float:
        """Forward FLOPs of one attention pair over those of one token's other work (matmuls
        and LM head): the tree packer's cost model. With "mask" a tree row pays every pair of
        the row; with "paths" attention costs what per-trajectory rows cost, so 0."""
        if self.tree_attention == "paths":
            return 0.0
        cfg = self.model.config
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        pair_flops = 4 * cfg.num_hidden_layers * heads * head_dim
        token_flops = 2 * sum(p.numel() for p in self.model.parameters())  # embedding ~ LM head matmul
        return pair_flops / token_flops

    def forward_backward(
        self, sequences: list[TrainSequence], loss_fn: LossFn, accumulate: bool = False
    ) -> TrainStats:
        """Compute the gradients of the loss over micro-batches (no clip, no step).

        The parameters' `.grad` hold the result; `grad_norm` is reported as 0. With
        `accumulate` the gradients add to those already held (a streamed step's
        micro-steps, claimed one at a time); otherwise they replace them. A non-finite
        loss zeroes the gradients and raises `NonFiniteError`.
        """
        if not sequences:
            raise ValueError("forward_backward needs at least one sequence")
        for seq in sequences:
            _check(seq)
        self.model.train()
        if not accumulate:
            self.optimizer.zero_grad(set_to_none=True)
        total_loss = 0.0
        abs_diff_sum = 0.0
        num_trained = 0
        extra_sums: dict[str, float] = {}
        for batch in micro_batches(sequences, self.micro_batch_tokens):
            cols = _collate(batch, self.pad_id, self.tree_attention)
            paths = cols.pop("gyre_paths", None)
            cols = {k: (v.to(self.device) if v is not None else None) for k, v in cols.items()}
            logp_BT = token_logprobs(
                self.model, cols["input_ids"], cols["attention"], self.temperature,
                cols.get("position_ids"), cols.get("prev"), **({"gyre_paths": paths} if paths else {}),
            )
            loss, stats = loss_fn(
                logp_BT, cols["behaviour"], cols["mask"], cols["weight"], cols["advantage"], cols["segment"]
            )
            if not torch.isfinite(loss):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError(f"loss is {loss.item()}; step skipped, weights unchanged")
            loss.backward()
            total_loss += float(loss.detach())
            mask = cols["mask"]
            abs_diff_sum += float((logp_BT.detach() - cols["behaviour"]).abs()[mask].sum())
            num_trained += int(mask.sum())
            for key, value in stats.items():
                extra_sums[key] = extra_sums.get(key, 0.0) + (value if is_summed(key) else value * len(batch))
        return TrainStats(
            loss=total_loss,
            grad_norm=0.0,
            logprob_abs_diff=abs_diff_sum / max(num_trained, 1),
            tokens_trained=num_trained,
            extra={k: v if is_summed(k) else v / len(sequences) for k, v in extra_sums.items()},
        )

    def train_step(self, sequences: list[TrainSequence], loss_fn: LossFn) -> TrainStats:
        if not sequences:
            raise ValueError("train_step needs at least one sequence")
        stats = self.forward_backward(sequences, loss_fn)
        stats.grad_norm = self.apply_gradients()
        return stats

    def apply_gradients(self) -> float:
        """Clip the held gradients, take one optimizer step, clear them; returns the norm.

        A non-finite norm clears the gradients and raises `NonFiniteError` (weights unchanged).
        """
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(f"gradient norm is {grad_norm}; step skipped, weights unchanged")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.steps_taken += 1
        return grad_norm

    def add_gradients_from(self, other: "TorchTrainEngine") -> None:
        """Reduce a data-parallel replica's gradients into this one's (the in-process form of
        a satellite's all-reduce onto the core cell), and clear the replica's."""
        for mine, theirs in zip(self.model.parameters(), other.model.parameters(), strict=True):
            if theirs.grad is None:
                continue
            if mine.grad is None:
                mine.grad = theirs.grad.detach().clone()
            else:
                mine.grad.add_(theirs.grad)
        other.optimizer.zero_grad(set_to_none=True)

    def copy_weights_from(self, other: "TorchTrainEngine") -> None:
        """Take another replica's weights (a satellite pulling the core's snapshot)."""
        self.model.load_state_dict(other.model.state_dict())

    def save_snapshot(self, path: Path) -> Path:
        from safetensors.torch import save_model

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(fd)
        try:
            save_model(self.model, tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path
