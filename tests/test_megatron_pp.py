"""Pipeline parallelism in the Megatron-core train engine against the torch reference.

Why it exists: with pp > 1 each rank holds one stage and `forward_backward` runs Megatron's
1F1B schedule over gloo (gyre/engines/megatron/pipeline.py); these tests spawn the ranks as
real processes (pp=2, tp=2 x pp=2, pp=2 x dp=2, pp=3) and check, on the same packed rows (plain and
tree-packed, three micro-batches so the schedule's warm-up, steady state and cool-down all
run) with the GSPO loss: loss and every HF-named gradient within 1e-4 of the reference (fp32),
the same stats and grad norm on every rank, every rank's gathered HF weights identical, the
HF snapshot after one step equal to the reference's step, and a pipeline with no rows (dp=2,
one row) taking part without them. Bad layouts are clear errors.
Skipped whole without the `megatron` extra.
"""

from __future__ import annotations

import datetime
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("megatron.core")

from gyre.algo.gspo import GSPO  # noqa: E402
from gyre.engines.megatron import convert as conv  # noqa: E402
from tests.test_megatron_train import LR, TOL, _batch, _engine, _max_diff, _other_family, _reference  # noqa: E402
from tests.weights_procs import free_port  # noqa: E402

MICRO_BATCH_TOKENS = 32  # the four rows go as [14, 9], [20], [15 (tree)]: three micro-batches


def _worker(rank: int, world: int, port: int, model_dir: str, tp: int, pp: int, seqs, out: str) -> None:
    """One rank: forward-backward, gradients, one step, a snapshot; its results to out.rank<r>."""
    import torch.distributed as dist

    from gyre.engines.megatron.train import MegatronParallel, MegatronTrainEngine

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))
        engine = MegatronTrainEngine(Path(model_dir), lr=LR, parallel=MegatronParallel(tp=tp, pp=pp),
                                     micro_batch_tokens=MICRO_BATCH_TOKENS)
        stats = engine.forward_backward(seqs, GSPO().loss)
        grads = engine.hf_gradients()
        norm = engine.apply_gradients()
        weights = engine.hf_state_dict()
        snapshot = engine.save_snapshot(Path(out) / "step1.safetensors")
        one = engine.forward_backward(seqs[:1], GSPO().loss)  # with dp=2 one pipeline has no row
        result = {"loss": stats.loss, "tokens": stats.tokens_trained, "abs_diff": stats.logprob_abs_diff,
                  "extra": stats.extra, "norm": norm, "weights": weights, "pp_rank": engine.pp_rank,
                  "one_row_tokens": one.tokens_trained}
        if rank == 0:
            result.update(grads=grads, snapshot=str(snapshot))
        torch.save(result, Path(out) / f"rank{rank}.pt")
        engine.close()
        dist.destroy_process_group()
    except BaseException:
        (Path(out) / f"err{rank}").write_text(traceback.format_exc())
        raise


def _run(model_dir: Path, seqs, tp: int, pp: int, out: Path, dp: int = 1, limit_s: float = 420) -> list[dict]:
    import torch.multiprocessing as mp

    world = tp * pp * dp
    ctx = mp.start_processes(_worker, args=(world, free_port(), str(model_dir), tp, pp, seqs, str(out)),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + limit_s
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, f"ranks did not finish in {limit_s} s"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    errors = [p.read_text() for p in sorted(out.glob("err*"))]
    assert not errors, errors[0]
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


def _check(results: list[dict], reference: dict, label: str, one_row_tokens: int) -> None:
    from safetensors.torch import load_file

    got = results[0]
    loss_diff = abs(got["loss"] - reference["loss"])
    grad_diff = _max_diff(got["grads"], reference["grads"])
    weight_diff = _max_diff(got["weights"], reference["weights"])
    snapshot = load_file(got["snapshot"])
    snapshot_diff = _max_diff(snapshot, reference["weights"])
    print(f"{label}: |loss diff| {loss_diff:.3g}, max |grad diff| {grad_diff:.3g}, "
          f"max |weight diff after step| {weight_diff:.3g}, snapshot {snapshot_diff:.3g}")
    assert loss_diff < TOL and grad_diff < TOL
    assert max(float(g.abs().max()) for g in reference["grads"].values()) > 1e-3
    assert abs(got["norm"] - reference["norm"]) < TOL
    assert weight_diff < 1e-5 and snapshot_diff < 1e-5
    assert set(snapshot) == set(got["weights"])
    ref_stats = reference["stats"]
    assert got["tokens"] == ref_stats.tokens_trained and abs(got["abs_diff"] - ref_stats.logprob_abs_diff) < TOL
    assert set(got["extra"]) == set(ref_stats.extra)
    assert all(abs(got["extra"][k] - ref_stats.extra[k]) < TOL for k in ref_stats.extra)
    assert {r["pp_rank"] for r in results} == set(range(max(r["pp_rank"] for r in results) + 1))
    assert all(r["one_row_tokens"] == one_row_tokens for r in results)
    for other in results[1:]:  # stats broadcast from the last stage, norm global, gathers whole
        assert (other["loss"], other["tokens"], other["abs_diff"], other["extra"], other["norm"]) == \
            (got["loss"], got["tokens"], got["abs_diff"], got["extra"], got["norm"])
        assert set(other["weights"]) == set(got["weights"])
        assert all(torch.equal(other["weights"][n], got["weights"][n]) for n in got["weights"])


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    return _batch(tiny_model_dir)


@pytest.fixture(scope="module")
def reference(tiny_model_dir, batch):
    return _reference(tiny_model_dir, batch)


@pytest.mark.slow
@pytest.mark.parametrize("tp, pp, dp", [(1, 2, 1), (2, 2, 1), (1, 2, 2)], ids=["pp2", "tp2xpp2", "pp2xdp2"])
def test_pipeline_matches_reference(tiny_model_dir, batch, reference, tmp_path, tp, pp, dp):
    """The tiny Qwen3 (tied embedding: its two copies' gradients summed, q/k norms). With dp=2
    the replicas run two and one micro-batches: rows 0, 2 and rows 1, 3."""
    _check(_run(tiny_model_dir, batch, tp, pp, tmp_path, dp), reference, f"TP={tp} x PP={pp} x DP={dp}",
           int(np.sum(batch[0].trainable)))


@pytest.mark.slow
def test_pipeline_untied_llama_matches_reference(tiny_model_dir, tmp_path):
    """An untied head (its own tensor on the last stage), head_dim != hidden / heads."""
    model_dir = _other_family(tiny_model_dir, tmp_path / "llama", "llama")
    seqs = _batch(model_dir)
    _check(_run(model_dir, seqs, 1, 2, tmp_path), _reference(model_dir, seqs), "llama PP=2", int(np.sum(seqs[0].trainable)))


@pytest.mark.slow
def test_three_stages_match_reference(tiny_model_dir, tmp_path):
    """pp=3 on a 3-layer tied Qwen3: a middle stage (receives and sends both ways, neither
    embedding nor head) and an embedding group whose two ends are not neighbours."""
    import shutil

    from transformers import Qwen3Config, Qwen3ForCausalLM

    model_dir = tmp_path / "qwen3-3"
    torch.manual_seed(5)
    Qwen3ForCausalLM(Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
    )).save_pretrained(model_dir)
    for f in tiny_model_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(f, model_dir / f.name)
    seqs = _batch(model_dir)
    _check(_run(model_dir, seqs, 1, 3, tmp_path), _reference(model_dir, seqs), "qwen3 PP=3", int(np.sum(seqs[0].trainable)))


def test_stage_split_round_trips():
    spec = conv.DecoderSpec("qwen3", 4, 8, 4, 2, 2, 12, 11, 1e-6, 1e4, 64, True, True, False)
    torch.manual_seed(0)
    hf = {n: torch.randn(shape) for n, shape in conv.hf_names(spec).items()}
    full = conv.to_megatron(spec, hf, 0, 1)
    stages = [conv.to_stage(spec, full, r, 2) for r in range(2)]
    assert "embedding.word_embeddings.weight" in stages[0] and "embedding.word_embeddings.weight" not in stages[1]
    assert torch.equal(stages[1]["output_layer.weight"], full["embedding.word_embeddings.weight"])  # the tied copy
    assert torch.equal(stages[1]["decoder.layers.0.mlp.linear_fc1.weight"], full["decoder.layers.2.mlp.linear_fc1.weight"])
    assert {n.split(".")[2] for n in stages[1] if n.startswith("decoder.layers.")} == {"0", "1"}
    assert "decoder.final_layernorm.weight" in stages[1] and "decoder.final_layernorm.weight" not in stages[0]
    back = conv.to_hf(spec, [conv.from_stages(spec, stages)])
    assert set(back) == set(hf) and all(torch.equal(back[n], hf[n]) for n in hf)


def test_bad_pipeline_layouts_are_clear_errors(tiny_model_dir):
    from gyre.config.run import MegatronConfig
    from gyre.engines.megatron.train import MegatronParallel

    with pytest.raises(conv.UnsupportedModelError, match="num_hidden_layers 2 is not divisible by pipeline parallel size 3"):
        _engine(tiny_model_dir, parallel=MegatronParallel(pp=3))
    with pytest.raises(ValueError, match=r"world size 1 is not a multiple of tp \* pp = 1 \* 2"):
        _engine(tiny_model_dir, parallel=MegatronParallel(pp=2))
    assert MegatronConfig(tp=2, pp=4).pp == 4
    with pytest.raises(ValueError, match="pp"):
        MegatronConfig(pp=0)
    engine = _engine(tiny_model_dir)  # the refusals left nothing behind: pp=1 still builds
    try:
        assert engine.pp_rank == 0
    finally:
        engine.close()


def test_one_process_pipeline_path_is_the_plain_one(tiny_model_dir, batch, reference):
    """pp = 1 never enters the schedule: its own loop over the three micro-batches still
    matches the reference (the loss helper is shared with the pipeline path)."""
    engine = _engine(tiny_model_dir, micro_batch_tokens=MICRO_BATCH_TOKENS)
    try:
        stats = engine.forward_backward(batch, GSPO().loss)
        grads = engine.hf_gradients()
    finally:
        engine.close()
    assert abs(stats.loss - reference["loss"]) < TOL and _max_diff(grads, reference["grads"]) < TOL
    assert stats.tokens_trained == reference["stats"].tokens_trained
