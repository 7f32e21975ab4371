"""The GSPO variant of DESIGN.md, exactly, as one small algorithm class.

For a trajectory i with trainable tokens t (policy-sampled; mask m_t = 1):

    log r_t   = min(log pi_theta(t) - log pi_behaviour(t), log C)      token ratio capped at C = 5
    s_i       = exp( sum_t m_t log r_t / sum_t m_t )                    sequence ratio
    s_i,t     = sg(s_i) * exp(log r_t - sg(log r_t))                    value s_i, gradient s_i * grad log r_t
    l_i,t     = -min(s_i,t * A_i, clip(s_i,t, 1 - eps_low, 1 + eps_high) * A_i)
    loss      = sum_i,t w_i,t * m_t * l_i,t

with eps_low = 0.005 and eps_high = 0.005 (clip range [0.995, 1.005]), A_i the group-relative
advantage of trajectory i's execution, and w the trajectory processor's weights (mean over
trainable tokens in an execution, then over executions). Capped tokens (ratio above C)
pass no gradient, and where the clipped term is the smaller one the token passes no
gradient either, as in PPO. Writing the sequence ratio per token (the GSPO-token form)
lets per-token weights (shared targets counted once) apply without changing its value.
With trainer == behaviour (fresh on-policy data) every ratio is 1 and the gradient is the
plain policy gradient -A_i * grad log pi.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GSPO:
    token_ratio_cap: float = 5.0
    seq_clip_low: float = 0.995
    seq_clip_high: float = 1.005
    name: str = "gspo"

    def __post_init__(self) -> None:
        if self.token_ratio_cap <= 1.0:
            raise ValueError(f"token_ratio_cap must be > 1, got {self.token_ratio_cap}")
        if not 0 < self.seq_clip_low <= 1.0 <= self.seq_clip_high:
            raise ValueError(
                f"sequence clip range must contain 1, got [{self.seq_clip_low}, {self.seq_clip_high}]"
            )

    def loss(self, logp_BT, behaviour_logp_BT, mask_BT, weight_BT, advantage_B):
        mask = mask_BT.to(logp_BT.dtype)
        log_ratio_BT = torch.clamp(logp_BT - behaviour_logp_BT, max=math.log(self.token_ratio_cap)) * mask
        num_tokens_B = mask.sum(-1).clamp(min=1.0)
        seq_ratio_B = torch.exp(log_ratio_BT.sum(-1) / num_tokens_B)
        token_ratio_BT = seq_ratio_B.detach().unsqueeze(-1) * torch.exp(log_ratio_BT - log_ratio_BT.detach())
        adv_B1 = advantage_B.unsqueeze(-1)
        unclipped = token_ratio_BT * adv_B1
        clipped = torch.clamp(token_ratio_BT, self.seq_clip_low, self.seq_clip_high) * adv_B1
        per_token = -torch.minimum(unclipped, clipped)
        loss = (per_token * weight_BT * mask).sum()
        with torch.no_grad():
            has_tokens = mask.sum(-1) > 0
            seq = seq_ratio_B[has_tokens]
            clipped_frac = ((seq < self.seq_clip_low) | (seq > self.seq_clip_high)).float().mean()
            capped = ((logp_BT - behaviour_logp_BT) > math.log(self.token_ratio_cap)) & mask_BT.bool()
            stats = {
                "seq_ratio_mean": float(seq.mean()) if seq.numel() else 1.0,
                "seq_clip_frac": float(clipped_frac) if seq.numel() else 0.0,
                "token_cap_frac": float(capped.sum() / mask.sum().clamp(min=1.0)),
            }
        return loss, stats
