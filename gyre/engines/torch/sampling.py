"""How the torch rollout engine's batch samples, one decode step at a time, and what each row collected.

`BatchSampler` draws one token per row from the temperature-scaled distribution (greedy at
temperature 0), truncated to the row's nucleus (`top_p`) and `top_k` where it asks: the
behaviour log-prob is that of the distribution the token was actually drawn from (see
`gyre.engines.base.SamplingParams`). `Rows` keeps each request's tokens and log-probs and how
it ended. The engine's decode loop (`rollout.py`) calls both.
"""

from __future__ import annotations

import torch

from gyre.engines.base import GenerationRequest, GenerationResult


class BatchSampler:
    """How a batch's rows sample: temperature (0: greedy), and top-p / top-k truncation where a
    row asks for it; behaviour log-probs are those of the distribution each token was drawn from."""

    def __init__(self, requests: list[GenerationRequest], device) -> None:
        # every tensor on the logits' device: a CPU temperature against CUDA logits fails the first decode step
        # (found by scripts/gpu_check.sh on an H200; tests/test_engines_top_p.py checks the placement)
        self.temps_B1 = torch.tensor([[max(r.params.temperature, 0.0)] for r in requests], dtype=torch.float32,
                                     device=device)
        self.greedy_B = self.temps_B1[:, 0] == 0.0
        # which rows truncate, from the requests (no device sync to learn whether any does)
        truncate = [r.params.temperature > 0 and (r.params.top_p < 1.0 or r.params.top_k > 0) for r in requests]
        self.truncating = any(truncate)
        self.top_p_B = torch.tensor([r.params.top_p for r in requests], dtype=torch.float32, device=device)
        self.top_k_B = torch.tensor([r.params.top_k for r in requests], dtype=torch.long, device=device)
        self.truncate_B = torch.tensor(truncate, dtype=torch.bool, device=device)

    def tensors(self) -> dict[str, torch.Tensor]:
        """What the sampler holds, by name (for checking where it lives)."""
        return {"temps_B1": self.temps_B1, "greedy_B": self.greedy_B, "top_p_B": self.top_p_B,
                "top_k_B": self.top_k_B, "truncate_B": self.truncate_B}

    def select(self, indices: torch.Tensor) -> None:
        """Keep only the batch rows `indices` (the decode loop drops finished rows)."""
        self.temps_B1, self.greedy_B = self.temps_B1[indices], self.greedy_B[indices]
        if self.truncating:
            self.top_p_B, self.top_k_B, self.truncate_B = (
                self.top_p_B[indices], self.top_k_B[indices], self.truncate_B[indices])

    def sample(self, logits_BV: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row and its behaviour log-prob."""
        scaled_BV = logits_BV / torch.where(self.greedy_B, 1.0, self.temps_B1[:, 0]).unsqueeze(-1)
        logp_BV = torch.log_softmax(scaled_BV, dim=-1)
        if self.truncating:
            logp_BV = torch.where(self.truncate_B.unsqueeze(-1), truncated(logp_BV, self.top_p_B, self.top_k_B),
                                  logp_BV)
        sampled_B = torch.multinomial(logp_BV.exp(), 1, generator=generator).squeeze(-1)
        tokens_B = torch.where(self.greedy_B, logp_BV.argmax(-1), sampled_B)
        return tokens_B, logp_BV.gather(-1, tokens_B.unsqueeze(-1)).squeeze(-1)


class Rows:
    """Each request's sampled tokens and log-probs as its batch decodes, and how it ended: a stop
    token, its budget (`length`), or its `stop` event set (`abort`, also before any token)."""

    def __init__(self, requests: list[GenerationRequest], budgets: list[int]) -> None:
        self.requests, self.budgets = requests, budgets
        self.outputs: list[list[int]] = [[] for _ in requests]
        self.logprobs: list[list[float]] = [[] for _ in requests]
        self.finish = ["length"] * len(requests)
        self.done = [b <= 0 for b in budgets]
        self.stops = [set(r.params.stop_token_ids) for r in requests]
        for row, req in enumerate(requests):
            if req.stop is not None and req.stop.is_set():
                self.done[row], self.finish[row] = True, "abort"

    def all_done(self) -> bool:
        return all(self.done)

    def accept(self, tokens: list[int], token_logps: list[float], live: list[int]) -> None:
        """The step's token for each row still going (reported to its `on_token` as sampled);
        `live[i]` is the request row of the batch's i-th row (finished rows leave the batch)."""
        for i, row in enumerate(live):
            req = self.requests[row]
            if self.done[row]:
                continue
            if req.stop is not None and req.stop.is_set():
                self.done[row], self.finish[row] = True, "abort"
                continue
            tok, logp = tokens[i], token_logps[i]
            self.outputs[row].append(tok)
            self.logprobs[row].append(logp)
            if req.on_token is not None:
                req.on_token(tok, logp)
            if tok in self.stops[row]:
                self.done[row], self.finish[row] = True, "stop"
            elif len(self.outputs[row]) >= self.budgets[row]:
                self.done[row] = True

    def results(self, make) -> list[GenerationResult]:
        return [make(self.outputs[row], self.logprobs[row], self.finish[row]) for row in range(len(self.requests))]


def truncated(logp_BV: torch.Tensor, top_p_B: torch.Tensor, top_k_B: torch.Tensor) -> torch.Tensor:
    """Log-probs renormalised over each row's nucleus (top_p) and top_k; -inf elsewhere.
    The most likely token is always kept; a row with top_p = 1 and top_k = 0 keeps all."""
    sorted_BV, order_BV = torch.sort(logp_BV, dim=-1, descending=True)
    probs_BV = sorted_BV.exp()
    mass_before_BV = probs_BV.cumsum(-1) - probs_BV  # mass of the more likely tokens
    rank_V = torch.arange(logp_BV.shape[-1], device=logp_BV.device)
    keep_BV = (mass_before_BV < top_p_B.unsqueeze(-1)) | (rank_V == 0)
    keep_BV &= (top_k_B.unsqueeze(-1) <= 0) | (rank_V < top_k_B.unsqueeze(-1))
    kept_BV = torch.full_like(logp_BV, float("-inf")).scatter(-1, order_BV, sorted_BV.masked_fill(~keep_BV, float("-inf")))
    return torch.log_softmax(kept_BV, dim=-1)
