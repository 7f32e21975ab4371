"""The algorithm interface: a loss over per-token tensors, and group advantages.

The train engine calls `algorithm.loss(...)` without knowing which objective it runs, so
GRPO or plain PPO-clip can sit beside GSPO as one small class each, chosen by config.
A loss knows tensors, never engines.
"""

from __future__ import annotations

from typing import Protocol

import torch


def segment_ids(mask_BT: torch.Tensor, segment_BT: torch.Tensor | None) -> torch.Tensor:
    """Each token's trajectory, flattened (`[B*T]`): `segment_BT` (tokens outside a segment, -1, go to trajectory 0,
    where the mask leaves them out), or row b for every token of row b in the plain layout (None)."""
    if segment_BT is None:
        rows, width = mask_BT.shape
        segment_BT = torch.arange(rows, device=mask_BT.device).unsqueeze(-1).expand(rows, width)
    return segment_BT.clamp(min=0).reshape(-1)


class Algorithm(Protocol):
    name: str

    def advantages(self, scores: dict[str, float | None]) -> dict[str, float]:
        """One group's per-execution advantages from its scores (None: the evaluation failed; no entry)."""
        ...

    def loss(
        self,
        logp_BT: torch.Tensor,
        behaviour_logp_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        weight_BT: torch.Tensor,
        advantage_S: torch.Tensor,
        segment_BT: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Return the scalar loss to backpropagate (already weighted) and float stats.

        Row b is one trajectory; `mask_BT` marks its trainable (policy-sampled) tokens;
        `weight_BT` is the trajectory processor's per-token weight (it sums to 1 per
        execution divided by the number of executions, so the loss is the mean over
        trainable tokens inside an execution, then the mean over executions).
        `segment_BT` (optional) names the trajectory of each token when a tree-packed row
        holds several; `advantage_S` is then per trajectory, not per row.
        """
        ...
