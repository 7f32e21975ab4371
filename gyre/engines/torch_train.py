"""The torch reference train engine: forward-backward on packed rows, AdamW, snapshots.

It recomputes each target token's log-prob under the current weights with the same
temperature scaling the rollout engine sampled with, hands the per-token tensors to the
algorithm's loss (the engine never knows which objective it runs), accumulates gradients
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

import torch

from gyre.engines.base import LossFn, TrainSequence, TrainStats
from gyre.engines.hf import load_causal_lm


class NonFiniteError(FloatingPointError):
    """Loss or gradients were NaN/inf; the optimizer step was not taken."""


def token_logprobs(model, input_ids_BT: torch.Tensor, attention_BT: torch.Tensor, temperature: float):
    """log p(token[t] | tokens[<t]) for t >= 1, shape [B, T] (position 0 is 0)."""
    logits_BTV = model(input_ids=input_ids_BT, attention_mask=attention_BT, use_cache=False).logits.float()
    if temperature > 0:
        logits_BTV = logits_BTV / temperature
    logp_BTV = torch.log_softmax(logits_BTV[:, :-1], dim=-1)
    target_logp = logp_BTV.gather(-1, input_ids_BT[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(target_logp, (1, 0))


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


def _collate(batch: list[TrainSequence], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(s.tokens) for s in batch)
    rows = len(batch)
    out = {
        "input_ids": torch.full((rows, width), pad_id, dtype=torch.long),
        "attention": torch.zeros((rows, width), dtype=torch.long),
        "mask": torch.zeros((rows, width), dtype=torch.bool),
        "behaviour": torch.zeros((rows, width), dtype=torch.float32),
        "weight": torch.zeros((rows, width), dtype=torch.float32),
        "advantage": torch.tensor([s.advantage for s in batch], dtype=torch.float32),
    }
    for row, seq in enumerate(batch):
        n = len(seq.tokens)
        out["input_ids"][row, :n] = torch.tensor(seq.tokens, dtype=torch.long)
        out["attention"][row, :n] = 1
        out["mask"][row, :n] = torch.tensor(seq.trainable, dtype=torch.bool)
        out["behaviour"][row, :n] = torch.tensor(seq.behaviour_logprobs, dtype=torch.float32)
        out["weight"][row, :n] = torch.tensor(seq.weights, dtype=torch.float32)
    return out


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
    ) -> None:
        torch.manual_seed(seed)
        self.device = torch.device(device)
        self.model = load_causal_lm(model_dir).to(self.device)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.grad_clip = grad_clip
        self.micro_batch_tokens = micro_batch_tokens
        self.temperature = temperature
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay
        )
        self.steps_taken = 0

    def train_step(self, sequences: list[TrainSequence], loss_fn: LossFn) -> TrainStats:
        if not sequences:
            raise ValueError("train_step needs at least one sequence")
        for seq in sequences:
            n = len(seq.tokens)
            if not (len(seq.trainable) == len(seq.behaviour_logprobs) == len(seq.weights) == n):
                raise ValueError(f"sequence of execution {seq.execution_id!r}: per-token arrays differ in length")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total_loss = 0.0
        abs_diff_sum = 0.0
        num_trained = 0
        extra_sums: dict[str, float] = {}
        for batch in micro_batches(sequences, self.micro_batch_tokens):
            cols = {k: v.to(self.device) for k, v in _collate(batch, self.pad_id).items()}
            logp_BT = token_logprobs(self.model, cols["input_ids"], cols["attention"], self.temperature)
            loss, stats = loss_fn(logp_BT, cols["behaviour"], cols["mask"], cols["weight"], cols["advantage"])
            if not torch.isfinite(loss):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError(f"loss is {loss.item()}; step skipped, weights unchanged")
            loss.backward()
            total_loss += float(loss.detach())
            mask = cols["mask"]
            abs_diff_sum += float((logp_BT.detach() - cols["behaviour"]).abs()[mask].sum())
            num_trained += int(mask.sum())
            for key, value in stats.items():
                extra_sums[key] = extra_sums.get(key, 0.0) + value * len(batch)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(f"gradient norm is {grad_norm}; step skipped, weights unchanged")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.steps_taken += 1
        return TrainStats(
            loss=total_loss,
            grad_norm=grad_norm,
            logprob_abs_diff=abs_diff_sum / max(num_trained, 1),
            tokens_trained=num_trained,
            extra={k: v / len(sequences) for k, v in extra_sums.items()},
        )

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
