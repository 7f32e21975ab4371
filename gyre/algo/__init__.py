"""Objectives and advantages: tensors in, a loss out; no engines, no I/O.

`make_algorithm(config.algo)` builds the configured one: `gspo` (DESIGN.md's GSPO variant,
group-relative advantages) or `rft` (rejection-sampling fine-tuning: the supervised baseline on
the policy's own solved samples). Each has `advantages(scores of one group)` and `loss(...)`.
"""

from __future__ import annotations

from gyre.algo.base import Algorithm


def make_algorithm(config) -> Algorithm:
    """The objective `config` (an `AlgoConfig`) names."""
    if config.name == "rft":
        from gyre.algo.rft import RFT

        return RFT(config.rft_solved_score)
    from gyre.algo.gspo import GSPO

    return GSPO(config.token_ratio_cap, config.seq_clip_low, config.seq_clip_high, normalize_std=config.normalize_std,
                baseline=config.baseline, solved_score=config.rft_solved_score if config.reward == "solved" else None,
                negative_weight=config.negative_weight)
