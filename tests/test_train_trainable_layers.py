"""`train.trainable_layers`: a real model trained on a CPU box through its top layers only."""

from __future__ import annotations


def test_trainable_layers_freeze_the_embedding_and_the_layers_below_and_train_the_rest(tiny_model_dir):
    import pytest

    from gyre.engines.torch.train import TorchTrainEngine, freeze_below

    engine = TorchTrainEngine(tiny_model_dir, lr=1e-3, trainable_layers=1)
    named = dict(engine.model.named_parameters())
    trained = {n for n, p in named.items() if p.requires_grad}
    top = len(engine.model.model.layers) - 1
    assert trained and all(n.startswith((f"model.layers.{top}.", "model.norm.")) for n in trained)
    assert sum(len(g["params"]) for g in engine.optimizer.param_groups) == len(trained)
    with pytest.raises(ValueError, match="must be in 1.."):
        freeze_below(engine.model, 99)
