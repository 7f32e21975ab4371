"""Checkpoints: a resumed train engine continues bit-identically; half-written ones never count."""

from __future__ import annotations

import pytest
import torch

from gyre.algo.gspo import GSPO
from gyre.trajectories.rows import TrainSequence
from gyre.engines.checkpoint import latest_checkpoint, load_checkpoint, prune_checkpoints, save_checkpoint
from gyre.engines.torch.train import TorchTrainEngine


def _rows(seed: int) -> list[TrainSequence]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for adv in (1.0, -0.5):
        tokens = torch.randint(3, 300, (40,), generator=gen).tolist()
        trainable = [False] * 20 + [True] * 20
        behaviour = [0.0] * 20 + (-torch.rand(20, generator=gen) * 3).tolist()
        rows.append(TrainSequence(tokens, trainable, behaviour, [0.0] * 20 + [0.025] * 20, adv))
    return rows


def test_resume_is_bit_identical(tmp_path, tiny_model_dir):
    loss = GSPO(seq_clip_low=0.5, seq_clip_high=2.0).loss
    first = TorchTrainEngine(tiny_model_dir, lr=1e-2, seed=0)
    first.train_step(_rows(0), loss)
    checkpoint = save_checkpoint(first, tmp_path / "ckpt", step=1)
    first.train_step(_rows(1), loss)

    resumed = TorchTrainEngine(tiny_model_dir, lr=1e-2, seed=123)
    assert load_checkpoint(resumed, checkpoint) == 1
    resumed.train_step(_rows(1), loss)
    for name, tensor in first.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], tensor), name
    assert resumed.steps_taken == first.steps_taken == 2


def test_incomplete_checkpoints_are_never_picked(tmp_path, tiny_model_dir):
    engine = TorchTrainEngine(tiny_model_dir, lr=1e-3)
    good = save_checkpoint(engine, tmp_path, step=3)
    (tmp_path / ".step-000004.partial").mkdir()  # what a crash mid-write leaves
    broken = tmp_path / "step-000005"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"")
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(FileNotFoundError, match="missing"):
        load_checkpoint(engine, broken)
    with pytest.raises(FileExistsError):
        save_checkpoint(engine, tmp_path, step=3)


def test_checkpoint_carries_the_rollout_engines_sampling_rng(tmp_path, tiny_model_dir):
    from gyre.engines.base import GenerationRequest, SamplingParams
    from gyre.engines.torch.rollout import TorchRolloutEngine

    trainer = TorchTrainEngine(tiny_model_dir, lr=1e-3, seed=0)
    first, other = TorchRolloutEngine(tiny_model_dir, seed=1), TorchRolloutEngine(tiny_model_dir, seed=99)
    try:
        ask = GenerationRequest([5, 6, 7], SamplingParams(1.0, 24))
        first.generate(ask)  # advance the stream before the checkpoint
        checkpoint = save_checkpoint(trainer, tmp_path / "ckpt", step=1, rollout=first)
        expected = first.generate(ask).output_ids
        load_checkpoint(TorchTrainEngine(tiny_model_dir, lr=1e-3, seed=5), checkpoint, rollout=other)
        assert other.generate(ask).output_ids == expected
    finally:
        first.close()
        other.close()


def test_pruning_keeps_the_newest_complete_checkpoints(tmp_path, tiny_model_dir):
    engine = TorchTrainEngine(tiny_model_dir, lr=1e-3)
    for step in (1, 2, 3, 4):
        save_checkpoint(engine, tmp_path, step=step)
    (tmp_path / ".step-000005.partial").mkdir()  # a write in progress is not a checkpoint: left alone
    assert prune_checkpoints(tmp_path, keep=0) == []
    removed = prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step-000001", "step-000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step-000005.partial", "step-000003", "step-000004"]
    assert load_checkpoint(engine, latest_checkpoint(tmp_path)) == 4
