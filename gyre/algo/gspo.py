"""The GSPO variant of DESIGN.md, exactly, as one small algorithm class.

For a trajectory i with trainable tokens t (policy-sampled; mask m_t = 1):

    log r_t   = min(log pi_theta(t) - log pi_behaviour(t), log C)      token ratio capped at C = 5
    s_i       = exp( sum_t m_t log r_t / sum_t m_t )                    sequence ratio
    s_i,t     = sg(s_i) * exp(log r_t - sg(log r_t))                    value s_i, gradient s_i * grad log r_t
    l_i,t     = -min(s_i,t * A_i, clip(s_i,t, 1 - eps_low, 1 + eps_high) * A_i)
    loss      = sum_i,t w_i,t * m_t * l_i,t

with eps_low = 0.005 and eps_high = 0.005 (clip range [0.995, 1.005]), A_i the group-relative
advantage of trajectory i's execution (a trajectory is a row, or a segment of a tree-packed
row named by `segment_BT`: the sums over t run over the trajectory, never the packed row), and w the trajectory processor's weights (mean over
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

from gyre.algo.advantages import BASELINES, group_advantages
from gyre.algo.base import segment_ids
from gyre.algo.rft import solved_weights


@dataclass(frozen=True)
class GSPO:
    token_ratio_cap: float = 5.0
    seq_clip_low: float = 0.995
    seq_clip_high: float = 1.005
    name: str = "gspo"
    normalize_std: bool = True
    """Group-relative advantages divided by the group's standard deviation (`advantages`)."""
    baseline: str = "group_mean"
    """What a score's advantage is measured from: its group's mean, or `none` (the score itself; `advantages`)."""
    solved_score: float | None = None
    """When set, the reward is 1 for a score at or above it (solved) and 0 below: partial credit ignored."""
    negative_weight: float = 1.0
    """Scale on negative advantages (1: GSPO's zero-sum group advantages; below 1 a failed sample is pushed down
    less than a solved one is pushed up: AsymRE-style asymmetry, `advantages`)."""

    def __post_init__(self) -> None:
        if self.token_ratio_cap <= 1.0:
            raise ValueError(f"token_ratio_cap must be > 1, got {self.token_ratio_cap}")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {', '.join(BASELINES)}, got {self.baseline!r}")
        if not 0.0 <= self.negative_weight <= 1.0:
            raise ValueError(f"negative_weight must be in [0, 1], got {self.negative_weight}")
        if not 0 < self.seq_clip_low <= 1.0 <= self.seq_clip_high:
            raise ValueError(
                f"sequence clip range must contain 1, got [{self.seq_clip_low}, {self.seq_clip_high}]"
            )

    def advantages(self, scores: dict[str, float | None]) -> dict[str, float]:
        """One group's advantages (execution id -> A_i), `gyre.algo.advantages`."""
        if self.solved_score is not None:
            scores = solved_weights(scores, self.solved_score)  # rft's filter as the reward: 1 solved, else 0
        advantages = group_advantages(scores, normalize_std=self.normalize_std, baseline=self.baseline)
        if self.negative_weight == 1.0:
            return advantages
        return {eid: a * self.negative_weight if a < 0 else a for eid, a in advantages.items()}

    def loss(self, logp_BT, behaviour_logp_BT, mask_BT, weight_BT, advantage_S, segment_BT=None):
        """Scalar loss and stats. Trajectory i's tokens are those with `segment_BT == i`
        (None: row i is trajectory i, the plain layout); `advantage_S[i]` is its advantage.
        A tree-packed row holds several trajectories, so s_i is summed per segment, not per row."""
        mask = mask_BT.to(logp_BT.dtype)
        segment_N = segment_ids(mask_BT, segment_BT)
        num_segments = advantage_S.shape[0]
        log_ratio_BT = torch.clamp(logp_BT - behaviour_logp_BT, max=math.log(self.token_ratio_cap)) * mask
        zeros_S = torch.zeros(num_segments, dtype=logp_BT.dtype, device=logp_BT.device)
        sum_S = zeros_S.index_add(0, segment_N, log_ratio_BT.reshape(-1))
        num_tokens_S = zeros_S.index_add(0, segment_N, mask.reshape(-1))
        seq_ratio_S = torch.exp(sum_S / num_tokens_S.clamp(min=1.0))
        seq_ratio_BT = seq_ratio_S.detach()[segment_N].reshape(log_ratio_BT.shape)
        token_ratio_BT = seq_ratio_BT * torch.exp(log_ratio_BT - log_ratio_BT.detach())
        adv_BT = advantage_S.to(logp_BT.dtype)[segment_N].reshape(log_ratio_BT.shape)
        unclipped = token_ratio_BT * adv_BT
        clipped = torch.clamp(token_ratio_BT, self.seq_clip_low, self.seq_clip_high) * adv_BT
        per_token = -torch.minimum(unclipped, clipped)
        loss = (per_token * weight_BT * mask).sum()
        with torch.no_grad():
            seq = seq_ratio_S[num_tokens_S > 0]
            low, high = seq < self.seq_clip_low, seq > self.seq_clip_high
            capped = ((logp_BT - behaviour_logp_BT) > math.log(self.token_ratio_cap)) & mask_BT.bool()
            stats = {
                "seq_ratio_mean": float(seq.mean()) if seq.numel() else 1.0,
                "seq_clip_frac": float((low | high).float().mean()) if seq.numel() else 0.0,
                "token_cap_frac": float(capped.sum() / mask.sum().clamp(min=1.0)),
                # counts and sums: added up over micro-batches and cells, turned into the step's
                # diagnostics by `diagnostics` (the fractions above are per micro-batch)
                "n_tokens": float(mask.sum()),
                "n_token_capped": float(capped.sum()),
                "n_seqs": float(seq.numel()),
                "n_seq_clip_low": float(low.sum()),
                "n_seq_clip_high": float(high.sum()),
                "nll_sum": float(-(logp_BT.detach() * mask).sum()),
            }
        return loss, stats


def diagnostics(sums: dict[str, float]) -> dict[str, float | None]:
    """A step's GSPO diagnostics from the summed `n_*` / `*_sum` stats of its micro-batches:

    - `token_cap_frac`: share of trained tokens whose ratio pi/pi_behaviour exceeded the cap C;
    - `clip_low_frac` / `clip_high_frac`: share of trajectories whose sequence ratio s_i fell
      below 1 - eps_low / above 1 + eps_high (their tokens then pass no gradient where the
      clipped term is the smaller one);
    - `sampled_entropy`: mean -log pi(token) over the sampled tokens, the Monte-Carlo estimate
      of the policy's entropy (exact in expectation when behaviour and current policy agree);
    - `mean_response_tokens`: trained tokens per trajectory.

    (Mean |log ratio| is `StepRecord.logprob_abs_diff`.) None where nothing was counted.
    """
    tokens, seqs = sums.get("n_tokens", 0.0), sums.get("n_seqs", 0.0)
    return {
        "token_cap_frac": sums.get("n_token_capped", 0.0) / tokens if tokens else None,
        "clip_low_frac": sums.get("n_seq_clip_low", 0.0) / seqs if seqs else None,
        "clip_high_frac": sums.get("n_seq_clip_high", 0.0) / seqs if seqs else None,
        "sampled_entropy": sums.get("nll_sum", 0.0) / tokens if tokens else None,
        "mean_response_tokens": tokens / seqs if seqs else None,
    }


def is_summed(key: str) -> bool:
    """Stats added up across micro-batches (counts, sums) rather than averaged."""
    return key.startswith("n_") or key.endswith("_sum")
