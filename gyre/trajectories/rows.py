"""Packed training rows: what the trajectory processor hands a train engine.

A `TrainSequence` is one row of tokens with, per position, whether the policy sampled it,
its behaviour log-prob and its loss weight; a tree-packed row also carries its attention
structure (`TreeLayout`) and the trajectory each trainable token belongs to. The
trajectory room builds them (`packing.py`, `processor.py`, `chains.py`); the train engines
(`gyre.engines`) consume them. They live here, below the engines, so that building a batch
never imports an engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class TreeLayout:
    """Ancestor-only attention inside one packed row (tree packing).

    The row is a run of spans (contiguous token runs, in row order). A token attends to the
    earlier tokens of its own span and to every token of its span's ancestors;
    `span_parent_S[s]` is the parent span (-1 for a root; several roots make independent
    trees in one row) and always comes earlier in the row. A span's first token is
    predicted from the last token of its parent span, and `position_ids_T` are depths in
    the tree, so every token sees exactly the context and rotary positions it would have
    at the end of its own trajectory's sequence.
    """

    span_starts_S: np.ndarray  # int, first row index of each span; span_starts_S[0] == 0
    span_parent_S: np.ndarray  # int, parent span or -1
    position_ids_T: np.ndarray  # int, depth of each token


@dataclass
class TrainSequence:
    """One packed training row: a token sequence and, per position, what to learn.

    `trainable[i]` marks tokens the policy sampled (targets); `behaviour_logprobs[i]` is
    their rollout log-prob; `weights[i]` the loss weight from the trajectory processor.
    Per-token fields are lists or 1-D numpy arrays.

    A plain row is one trajectory: causal attention, positions 0..n-1, one GSPO sequence
    ratio over its trainable tokens, advantage `advantage`. A tree-packed row carries
    `tree` (its attention structure and positions) and `segment_ids`: the trajectory each
    trainable token belongs to (0..k-1 within the row, -1 elsewhere), so the sequence
    ratio is taken per trajectory, never per row; `segment_advantages[k]` is segment k's
    advantage (None: all use `advantage`), `segment_execution_ids[k]` its execution.
    """

    tokens: Sequence[int]
    trainable: Sequence[bool]
    behaviour_logprobs: Sequence[float]
    weights: Sequence[float]
    advantage: float
    execution_id: str = ""
    tree: TreeLayout | None = None
    segment_ids: Sequence[int] | None = None
    segment_advantages: Sequence[float] | None = None
    segment_execution_ids: Sequence[str] | None = None  # execution of each segment (bookkeeping)

    @property
    def num_segments(self) -> int:
        if self.segment_ids is None:
            return 1
        return int(np.max(self.segment_ids)) + 1 if len(self.segment_ids) else 0
