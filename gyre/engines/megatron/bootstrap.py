"""Megatron-core on our machines: process groups, the CPU patches, the model build.

What `MegatronTrainEngine` (engines/megatron_train.py) needs from Megatron before it can train:
the parallel layout (`MegatronParallel`, `_init_parallel`: tp x pp x dp over the current
`torch.distributed` world, a one-process gloo group when there is none), megatron-core 0.16's
CUDA assumptions handled on a CPU box (`_patch_for_cpu`, `_no_embedding_sync`, `_quiet`; the
engine module's docstring lists them), `GPTModel` built from the converter's decoder spec
(this rank's pipeline stage only), and the vocabulary gather done without CUDA
(`_GatherVocab`). Megatron is imported only here, in the engine and in its pipeline module
(engines/megatron_pipeline.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gyre.engines.megatron import convert as conv


@dataclass(frozen=True)
class MegatronParallel:
    """Model-parallel sizes (`train.megatron`); data parallelism is world / (tp * pp)."""

    tp: int = 1
    pp: int = 1


_patched = False
_engines_alive = 0  # MegatronTrainEngine instances alive in this process (the engine counts them)
_owned_group = False
_SHARED_BUFFER = threading.Lock()  # unpatched (CUDA), attention's scratch buffer is process-wide


@contextlib.contextmanager
def _quiet():
    """megatron-core warns on import and build that Apex / Transformer Engine are absent, which
    is expected here (local specs, torch norms and optimizers): those warnings only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine)( and Apex)? (is|are) not installed")
        warnings.filterwarnings("ignore", message=r"full scope is deprecated")
        yield


def _patch_for_cpu() -> None:
    global _patched
    if _patched or torch.cuda.is_available():
        return
    from megatron.core import utils as mutils

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
        # a fresh tensor each call, not a shared buffer: replicas in one process (live cells'
        # satellites) run forward passes in concurrent threads
        return torch.empty(tuple(tensor_shape), dtype=dtype, device="cpu")

    mutils.GlobalMemoryBuffer.get_tensor = get_tensor
    _patched = True


def _init_parallel(parallel: MegatronParallel) -> None:
    global _owned_group
    with _quiet():
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel.random import initialize_rng_tracker

    if parallel.tp < 1 or parallel.pp < 1:
        raise ValueError(f"megatron tp and pp must be >= 1, got tp={parallel.tp} pp={parallel.pp}")
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) != 1:
            raise RuntimeError("WORLD_SIZE > 1 but torch.distributed is not initialised: call init_process_group first")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        _owned_group = True
    world = dist.get_world_size()
    if world % (parallel.tp * parallel.pp):
        raise ValueError(f"world size {world} is not a multiple of tp * pp = {parallel.tp} * {parallel.pp}: "
                         "run one process per rank (e.g. torchrun) with torch.distributed initialised "
                         "(world = tp x pp x data-parallel)")
    if ps.model_parallel_is_initialized():
        have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size())
        if have != (parallel.tp, parallel.pp):
            raise ValueError(f"megatron parallel state already set up with tp, pp = {have}, this engine asks {parallel.tp, parallel.pp}")
    else:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=parallel.tp, pipeline_model_parallel_size=parallel.pp,
            create_gloo_process_groups=False,
        )
    _patch_for_cpu()
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


@contextlib.contextmanager
def _no_embedding_sync():
    """With pp > 1 and a tied head, GPTModel's constructor copies the first stage's embedding
    to the last stage's head with `weight.data.cuda()` and an all-reduce
    (`LanguageModule.setup_embeddings_and_output_layer`); without CUDA that raises. The engine
    loads both copies from the HF weights right after the build, so the copy is skipped: its
    `_is_in_embd_group` answers False during the build (under a lock: replicas build in threads)."""
    if torch.cuda.is_available():
        yield
        return
    from megatron.core.models.common.language_module.language_module import LanguageModule

    with _BUILD_LOCK:
        original = LanguageModule.__dict__["_is_in_embd_group"]
        LanguageModule._is_in_embd_group = lambda self: False
        try:
            yield
        finally:
            LanguageModule._is_in_embd_group = original


_BUILD_LOCK = threading.Lock()


def _build_model(spec: conv.DecoderSpec, tp: int, pp: int):
    """Megatron's GPTModel with local (torch-only) layer specs, shaped like the HF model; with
    pp > 1 this rank's stage only (its layers; the embedding first, the final norm and head last)."""
    import torch.nn.functional as F

    with _quiet():
        from megatron.core import parallel_state as ps
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer import TransformerConfig

        config = TransformerConfig(
            num_layers=spec.num_layers, hidden_size=spec.hidden_size, num_attention_heads=spec.num_heads,
            num_query_groups=spec.num_kv_heads, kv_channels=spec.head_dim, ffn_hidden_size=spec.ffn_hidden_size,
            normalization="RMSNorm", layernorm_epsilon=spec.norm_eps, qk_layernorm=spec.qk_norm,
            gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=spec.qkv_bias,
            hidden_dropout=0.0, attention_dropout=0.0, attention_softmax_in_fp32=True,
            bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
            apply_rope_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
            use_cpu_initialization=True, perform_initialization=False, params_dtype=torch.float32,
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, sequence_parallel=False,
            # pipeline schedule (engines/megatron_pipeline.py): activations sent in fp32 and each
            # micro-batch's loss taken as it is (a sum; not divided by micro-batches or tokens)
            pipeline_dtype=torch.float32, calculate_per_token_loss=True,
        )
        # micro-batches differ in shape (Megatron's own p2p then sends shapes first); set after
        # construction: __post_init__ refuses it for its MoE token dispatcher, which we never build
        config.variable_seq_lengths = pp > 1
        with _no_embedding_sync() if pp > 1 and spec.tied_embeddings else contextlib.nullcontext():
            return GPTModel(
                config, get_gpt_layer_local_spec(qk_layernorm=spec.qk_norm, normalization="RMSNorm"),
                vocab_size=spec.padded_vocab(tp), max_sequence_length=spec.max_position_embeddings,
                share_embeddings_and_output_weights=spec.tied_embeddings, position_embedding_type="rope",
                rotary_base=spec.rope_theta, parallel_output=True,
                pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
            )


class _GatherVocab(torch.autograd.Function):
    """All-gather vocabulary-parallel logits along the last dim; backward keeps this rank's
    slice (every TP rank computes the same loss from the same full logits). Megatron's own
    gather allocates on `torch.cuda.current_device()`, so the engine does it here."""

    @staticmethod
    def forward(ctx, local, group):
        ctx.group = group
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        rank, world = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        return grad.chunk(world, dim=-1)[rank].contiguous(), None
