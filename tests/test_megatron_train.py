"""The Megatron-core train engine against the torch reference (gyre/engines/megatron/train.py).

Skipped whole without the `megatron` extra. On CPU with gloo: HF <-> Megatron round trip
bit-exact; on the same packed micro-batch with the GSPO loss, loss and every gradient (in
HF names) equal the reference's within 1e-4 in fp32, with TP=1 in this process and with
TP=2 (and DP=2) over two spawned processes; a step then a snapshot loads into the torch
rollout engine and matches the reference's weights after the same step; bad configs and
snapshots are errors naming the attribute or tensor.
"""

from __future__ import annotations

import json
import shutil
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("megatron.core")

from gyre.algo.gspo import GSPO  # noqa: E402
from gyre.engines.megatron import convert as conv  # noqa: E402
from gyre.trajectories.rows import TrainSequence, TreeLayout  # noqa: E402
from gyre.engines.torch.train import TorchTrainEngine, _collate, token_logprobs  # noqa: E402
from tests.weights_procs import free_port  # noqa: E402

# Adam's first step moves every weight by about lr whatever its gradient's size, so weights
# whose gradient is ~1e-7 (fp32 noise between two implementations) move by ~lr * (a few %)
# differently: at lr 1e-2 the engines differ by ~1e-4 after a step, at 1e-4 by ~1e-6.
LR = 1e-4
TOL = 1e-4


def _hf_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def _batch(model_dir: Path, tree: bool = True) -> list[TrainSequence]:
    """Three plain rows of different lengths (padding) and, with `tree`, one tree-packed row
    (two trajectories sharing a prefix); behaviour log-probs near the current policy's so
    the GSPO ratios stay inside the clip range and every token passes gradient."""
    rng = np.random.default_rng(7)
    rows = []
    for n, adv in ((14, 1.0), (9, -0.5), (20, 0.75)):
        tr = np.zeros(n, np.bool_)
        tr[n // 3:] = True
        rows.append(TrainSequence(tokens=rng.integers(3, 500, n), trainable=tr, behaviour_logprobs=np.zeros(n),
                                  weights=tr * np.float32(0.05), advantage=adv, execution_id=f"e{n}"))
    if tree:  # spans: root [0, 6), child a [6, 10), child b [10, 15)
        n = 15
        tr = np.zeros(n, np.bool_)
        tr[6:] = True
        seg = np.where(tr, np.r_[np.full(10, 0), np.full(5, 1)], -1)
        rows.append(TrainSequence(
            tokens=rng.integers(3, 500, n), trainable=tr, behaviour_logprobs=np.zeros(n), weights=tr * np.float32(0.1),
            advantage=0.0, execution_id="tree",
            tree=TreeLayout(np.array([0, 6, 10]), np.array([-1, 0, 0]), np.r_[np.arange(10), np.arange(6, 11)]),
            segment_ids=seg, segment_advantages=[0.8, -1.2],
        ))
    ref = TorchTrainEngine(model_dir, lr=LR, tree_attention="mask")
    with torch.no_grad():
        for seq in rows:
            cols = _collate([seq], ref.pad_id, "mask")
            logp = token_logprobs(ref.model, cols["input_ids"], cols["attention"], 1.0,
                                  cols.get("position_ids"), cols.get("prev"))[0].numpy()
            seq.behaviour_logprobs = np.where(seq.trainable, logp + rng.normal(0, 1e-3, len(logp)), 0.0)
    return rows


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    return _batch(tiny_model_dir)


def _reference(model_dir: Path, seqs: list[TrainSequence]) -> dict:
    ref = TorchTrainEngine(model_dir, lr=LR, tree_attention="mask")
    stats = ref.forward_backward(seqs, GSPO().loss)
    grads = {n: p.grad.clone() for n, p in ref.model.named_parameters()}
    norm = ref.apply_gradients()
    weights = {n: p.detach().clone() for n, p in ref.model.named_parameters()}  # a tied head once
    return {"loss": stats.loss, "grads": grads, "norm": norm, "weights": weights, "stats": stats}


@pytest.fixture(scope="module")
def reference(tiny_model_dir, batch):
    return _reference(tiny_model_dir, batch)


def _max_diff(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    assert set(theirs) <= set(ours), sorted(set(theirs) - set(ours))
    return max(float((ours[n] - t).abs().max()) for n, t in theirs.items())


def _engine(model_dir, **kw):
    from gyre.engines.megatron.train import MegatronTrainEngine

    return MegatronTrainEngine(model_dir, lr=LR, **kw)


def test_round_trip_is_bit_exact(tiny_model_dir):
    hf = _hf_tensors(tiny_model_dir)
    spec = conv.spec_from_hf_config(json.loads((tiny_model_dir / "config.json").read_text()))
    for tp in (1, 2):
        back = conv.to_hf(spec, [conv.to_megatron(spec, hf, r, tp) for r in range(tp)])
        assert set(back) == set(hf)
        assert all(torch.equal(back[n], hf[n]) for n in hf)
    engine = _engine(tiny_model_dir)
    try:
        state = engine.hf_state_dict()
        assert set(state) == set(hf) and all(torch.equal(state[n], hf[n]) for n in hf)
    finally:
        engine.close()


def test_round_trip_pads_vocab_and_keeps_untied_head_and_biases():
    spec = conv.DecoderSpec("qwen2", 1, 8, 4, 2, 2, 12, 11, 1e-6, 1e4, 64, False, False, True)
    torch.manual_seed(0)
    hf = {n: torch.randn(shape) for n, shape in conv.hf_names(spec).items()}
    shards = [conv.to_megatron(spec, hf, r, 2) for r in range(2)]
    assert shards[0]["embedding.word_embeddings.weight"].shape == (6, 8)  # 11 rows padded to 12
    assert torch.count_nonzero(shards[1]["output_layer.weight"][-1]) == 0
    back = conv.to_hf(spec, shards)
    assert set(back) == set(hf) and all(torch.equal(back[n], hf[n]) for n in hf)


def test_loss_and_gradients_match_reference_tp1(tiny_model_dir, batch, reference):
    engine = _engine(tiny_model_dir)
    try:
        stats = engine.forward_backward(batch, GSPO().loss)
        grads = engine.hf_gradients()
    finally:
        engine.close()
    loss_diff = abs(stats.loss - reference["loss"])
    grad_diff = _max_diff(grads, reference["grads"])
    print(f"TP=1: |loss diff| {loss_diff:.3g}, max |grad diff| {grad_diff:.3g}")
    assert loss_diff < TOL and grad_diff < TOL
    assert max(float(g.abs().max()) for g in reference["grads"].values()) > 1e-3  # gradients are not trivially 0
    assert stats.tokens_trained == reference["stats"].tokens_trained
    assert abs(stats.logprob_abs_diff - reference["stats"].logprob_abs_diff) < TOL


def test_step_snapshot_loads_into_rollout_engine(tiny_model_dir, batch, reference, tmp_path):
    from gyre.engines.torch.rollout import TorchRolloutEngine

    engine = _engine(tiny_model_dir)
    try:
        engine.forward_backward(batch[:2], GSPO().loss)
        engine.forward_backward(batch[2:], GSPO().loss, accumulate=True)  # streamed micro-steps add up
        norm = engine.apply_gradients()
        snapshot = engine.save_snapshot(tmp_path / "step1.safetensors")
        assert engine.steps_taken == 1
    finally:
        engine.close()
    assert abs(norm - reference["norm"]) < TOL
    rollout = TorchRolloutEngine(tiny_model_dir, prefix_cache_bytes=0)
    try:
        rollout.load_weights(snapshot, version=1)
        loaded = rollout.model.state_dict()
    finally:
        rollout.close()
    diff = _max_diff(loaded, reference["weights"])
    moved = _max_diff(loaded, _hf_tensors(tiny_model_dir))
    print(f"after one step: max |weight diff| {diff:.3g} (largest move {moved:.3g})")
    assert diff < 1e-5 and moved > LR / 2


def _other_family(tiny_model_dir: Path, out: Path, model_type: str) -> Path:
    """A tiny Qwen2 (qkv biases, no q/k norm, tied) or Llama (untied head, head_dim 32 != hidden /
    heads, as in Qwen3-0.6B) with the tiny tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32 if model_type == "llama" else 16,
                 rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    torch.manual_seed(3)
    if model_type == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=True))
    else:
        model = LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=False))
    with torch.no_grad():  # biases are zero at init: make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(out)
    for f in tiny_model_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(f, out / f.name)
    return out


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_other_families_match_reference(tiny_model_dir, tmp_path, model_type):
    model_dir = _other_family(tiny_model_dir, tmp_path / model_type, model_type)
    seqs = _batch(model_dir)
    reference = _reference(model_dir, seqs)
    engine = _engine(model_dir)
    try:
        assert engine.spec.qkv_bias == (model_type == "qwen2") and engine.spec.tied_embeddings == (model_type == "qwen2")
        hf = _hf_tensors(model_dir)
        assert all(torch.equal(engine.hf_state_dict()[n], hf[n]) for n in hf)
        stats = engine.forward_backward(seqs, GSPO().loss)
        grads = engine.hf_gradients()
    finally:
        engine.close()
    assert abs(stats.loss - reference["loss"]) < TOL
    assert _max_diff(grads, reference["grads"]) < TOL


# -- tensor and data parallelism over two processes ---------------------------------------

def _worker(rank: int, port: int, model_dir: str, tp: int, seqs, out: str) -> None:
    """One rank of a world of two (gloo, 127.0.0.1): forward-backward, gradients, one step."""
    import torch.distributed as dist

    from gyre.engines.megatron.train import MegatronParallel, MegatronTrainEngine

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=__import__("datetime").timedelta(seconds=60))
        engine = MegatronTrainEngine(Path(model_dir), lr=LR, parallel=MegatronParallel(tp=tp))
        stats = engine.forward_backward(seqs, GSPO().loss)
        grads = engine.hf_gradients()
        norm = engine.apply_gradients()
        weights = engine.hf_state_dict()
        one = engine.forward_backward(seqs[:1], GSPO().loss)  # with DP=2 one replica has no row
        if rank == 0:
            torch.save({"loss": stats.loss, "grads": grads, "norm": norm, "weights": weights,
                        "one_row_tokens": one.tokens_trained}, out)
        engine.close()
        dist.destroy_process_group()
    except BaseException:
        Path(out + f".err{rank}").write_text(traceback.format_exc())
        raise


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 1], ids=["tp2", "dp2"])
def test_two_processes_match_reference(tiny_model_dir, batch, reference, tmp_path, tp):
    import torch.multiprocessing as mp

    out = str(tmp_path / "rank0.pt")
    ctx = mp.start_processes(_worker, args=(free_port(), str(tiny_model_dir), tp, batch, out),
                             nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, "ranks did not finish in 120 s"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    errors = [p.read_text() for p in tmp_path.glob("rank0.pt.err*")]
    assert not errors, errors[0]
    got = torch.load(out)
    loss_diff = abs(got["loss"] - reference["loss"])
    grad_diff = _max_diff(got["grads"], reference["grads"])
    weight_diff = _max_diff(got["weights"], reference["weights"])
    print(f"{'TP=2' if tp == 2 else 'DP=2'}: |loss diff| {loss_diff:.3g}, max |grad diff| {grad_diff:.3g}, "
          f"max |weight diff after step| {weight_diff:.3g}")
    assert loss_diff < TOL and grad_diff < TOL
    assert abs(got["norm"] - reference["norm"]) < TOL
    assert weight_diff < 1e-5
    assert got["one_row_tokens"] == int(np.sum(batch[0].trainable))


# -- bad input ------------------------------------------------------------------------------

def _config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


@pytest.mark.parametrize("change, named", [
    ({"model_type": "gpt2"}, "'gpt2'"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_parameters.rope_type"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"num_experts": 8}, "num_experts"),
])
def test_unsupported_config_is_named(tiny_model_dir, change, named):
    with pytest.raises(conv.UnsupportedModelError, match=named.replace(".", r"\.")):
        conv.spec_from_hf_config({**_config(tiny_model_dir), **change})


def test_engine_refuses_unsupported_model_dir_and_tp(tiny_model_dir, tmp_path):
    bad = tmp_path / "gpt2ish"
    shutil.copytree(tiny_model_dir, bad)
    (bad / "config.json").write_text(json.dumps({**_config(tiny_model_dir), "model_type": "gpt2"}))
    with pytest.raises(conv.UnsupportedModelError, match="model_type 'gpt2'"):
        _engine(bad)
    from gyre.engines.megatron.train import MegatronParallel

    with pytest.raises(conv.UnsupportedModelError, match="num_attention_heads 4 is not divisible by tensor parallel size 3"):
        _engine(tiny_model_dir, parallel=MegatronParallel(tp=3))
    with pytest.raises(conv.UnsupportedModelError, match="num_hidden_layers 2 is not divisible by pipeline parallel size 3"):
        _engine(tiny_model_dir, parallel=MegatronParallel(pp=3))  # pp > 1 itself: tests/test_megatron_pp.py


def test_snapshot_with_wrong_shape_names_the_tensor(tiny_model_dir, tmp_path):
    from safetensors.torch import save_file

    hf = _hf_tensors(tiny_model_dir)
    wrong = dict(hf)
    wrong["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(8, 64)
    save_file(wrong, str(tmp_path / "wrong.safetensors"))
    missing = {n: t for n, t in hf.items() if n != "model.layers.0.mlp.up_proj.weight"}
    save_file(missing, str(tmp_path / "missing.safetensors"))
    engine = _engine(tiny_model_dir)
    try:
        before = engine.hf_state_dict()
        with pytest.raises(conv.WeightShapeError, match=r"'model\.layers\.1\.self_attn\.k_proj\.weight' has shape \[8, 64\], expected \[32, 64\]"):
            engine.load_snapshot(tmp_path / "wrong.safetensors")
        with pytest.raises(conv.WeightShapeError, match=r"'model\.layers\.0\.mlp\.up_proj\.weight' is missing"):
            engine.load_snapshot(tmp_path / "missing.safetensors")
        after = engine.hf_state_dict()
        assert all(torch.equal(before[n], after[n]) for n in before)  # refused whole
        save_file(hf, str(tmp_path / "good.safetensors"))
        engine.load_snapshot(tmp_path / "good.safetensors")
    finally:
        engine.close()


# -- the run's wiring: train.engine, checkpoints ---------------------------------------------

def test_config_selects_engine_and_checkpoint_resumes_bit_exactly(tiny_model_dir, batch, tmp_path):
    from gyre.config.run import RunConfig
    from gyre.engines.checkpoint import load_checkpoint, save_checkpoint
    from gyre.engines.factory import train_engine
    from gyre.engines.megatron.train import MegatronTrainEngine

    config = RunConfig.model_validate({"train": {"engine": "megatron", "lr": LR, "megatron": {"tp": 1}}})
    engine = train_engine(config, tiny_model_dir, seed=0)
    try:
        assert isinstance(engine, MegatronTrainEngine)
        engine.train_step(batch[:2], GSPO().loss)
        checkpoint = save_checkpoint(engine, tmp_path / "checkpoints", 1)
        engine.train_step(batch[2:], GSPO().loss)
        straight = engine.hf_state_dict()
        assert load_checkpoint(engine, checkpoint) == 1 and engine.steps_taken == 1
        engine.train_step(batch[2:], GSPO().loss)
        resumed = engine.hf_state_dict()
    finally:
        engine.close()
    assert all(torch.equal(straight[n], resumed[n]) for n in straight)


@pytest.mark.slow
def test_elastic_live_cells_train_with_megatron(tiny_model_dir, tmp_path):
    """The run's own path: satellites' Megatron replicas (same process, threads) stream
    micro-steps, their gradients reduced onto the core's, checkpoints and publications."""
    from gyre.cells import events as ev
    from gyre.runtime.coordinator import Coordinator
    from gyre.runtime.live.cells import LiveCells
    from tests.test_cells_live import _config

    config = _config(tiny_model_dir, tmp_path, policy="elastic", num_cells=3, slots_per_cell=8,
                     lookahead_groups=2, executions_per_micro_step=2)
    config.train.engine = "megatron"
    config.train.checkpoint_every = 2
    coord = Coordinator(config, tmp_path / "run")
    cells = LiveCells(coord, config.steps)
    try:
        records = cells.run()
        cells.close()
        assert coord.rollout.policy_version == coord.policy_version == config.steps
    finally:
        coord.close()
    from megatron.core import parallel_state as ps

    assert not ps.model_parallel_is_initialized()  # the cells' and the coordinator's closes released it
    assert type(coord.trainer).__name__ == "MegatronTrainEngine" and coord.trainer.steps_taken == 3
    assert all(r.tokens_trained > 0 and r.grad_norm is not None and r.logprob_abs_diff < 1e-4 for r in records)
    assert any(c.cell_id != 0 for c in cells.log.of(ev.ClaimMicroStep))  # satellites trained
