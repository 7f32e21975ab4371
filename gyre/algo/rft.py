"""Rejection-sampling fine-tuning (RFT): supervised steps on the policy's own solved samples.

The baseline RL has to beat. From rollouts sampled as RL's are (a step's groups, as many, sampled
by RFT's own current policy: not RL's samples), keep the executions that solved their task (score >= `solved_score`, every
hidden test passed by default) and take a supervised step on their trainable tokens: the loss is
the negative log-likelihood with the trajectory processor's weights (mean over an execution's
trained tokens, then over the step's executions, unsolved ones counting as zero), so the step
size matches GSPO's on-policy gradient for a positive advantage of 1. This is online RFT
(expert iteration, ReST-style filtering): the filter runs each step on fresh samples. Nothing
in it uses the failed samples or a baseline, which is what RL adds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gyre.algo.base import segment_ids


def solved_weights(scores: dict[str, float | None], solved_score: float = 1.0) -> dict[str, float]:
    """Execution id -> 1.0 when its score reached `solved_score`, else 0.0; failed evaluations get none."""
    return {eid: 1.0 if s >= solved_score else 0.0 for eid, s in scores.items() if s is not None}


@dataclass(frozen=True)
class RFT:
    solved_score: float = 1.0
    name: str = "rft"

    def advantages(self, scores: dict[str, float | None]) -> dict[str, float]:
        return solved_weights(scores, self.solved_score)

    def loss(self, logp_BT, behaviour_logp_BT, mask_BT, weight_BT, advantage_S, segment_BT=None):
        """-sum_t w_t m_t keep_i log pi(t): the NLL of the solved trajectories' tokens (no ratio, no clip)."""
        mask = mask_BT.to(logp_BT.dtype)
        segment_N = segment_ids(mask_BT, segment_BT)
        keep_BT = advantage_S.to(logp_BT.dtype)[segment_N].reshape(mask.shape)
        loss = -(logp_BT * weight_BT * mask * keep_BT).sum()
        with torch.no_grad():
            kept = mask * keep_BT
            zeros_S = torch.zeros(advantage_S.shape[0], dtype=logp_BT.dtype, device=logp_BT.device)
            tokens_S = zeros_S.index_add(0, segment_N, mask.reshape(-1))
            stats = {
                "n_tokens": float(mask.sum()),
                "n_seqs": float((tokens_S > 0).sum()),
                "n_kept_tokens": float(kept.sum()),
                "nll_sum": float(-(logp_BT.detach() * mask).sum()),
            }
        return loss, stats
