"""Hugging Face <-> Megatron-core weights for the Megatron train engine, both ways.

Why it exists: the Megatron engine (engines/megatron_train.py) trains a Megatron-core
`GPTModel` but everything else in gyre speaks Hugging Face tensor names (the rollout
engines load HF safetensors snapshots, checkpoints and model directories are HF). This
module is the one place that knows how the two layouts relate; it is pure torch (no
megatron import), so its mapping is testable without the extra.

What it maps (one decoder family: Qwen3, Qwen2, Llama; pre-norm, RMSNorm, rotary, SwiGLU,
GQA, optional q/k norm, optional qkv bias, tied or untied LM head):

- `q_proj`, `k_proj`, `v_proj` -> one `linear_qkv` whose rows are grouped per key/value
  head: [q heads of group g, k_g, v_g] for g = 0..G-1; tensor parallelism gives each rank a
  contiguous run of G / tp groups.
- `gate_proj`, `up_proj` -> one `linear_fc1` [gate; up]; each rank holds [gate_r; up_r].
- `o_proj` / `down_proj` split along their input dimension (row parallel); embeddings and
  an untied LM head split along the vocabulary, padded to a multiple of tp with zero rows
  (the engine never lets a padded row reach the softmax).
- norms are replicated.

`to_megatron` slices one TP rank's shard out of the full HF state dict; `to_hf` joins all
ranks' shards back into HF names. Pipeline parallelism: `to_stage` keeps one stage's part of
a TP shard (its layers renamed to the stage's local indices, the embedding on the first
stage, the final norm and head on the last; a tied head is a copy of the embedding there),
`from_stages` joins the stages back. The round trip is bit-exact (only slicing and
concatenation). Errors name the config attribute or tensor they are about.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")


class UnsupportedModelError(ValueError):
    """The HF config has something the converter cannot map; the message names it."""


class WeightShapeError(ValueError):
    """A tensor's shape does not fit the model; the message names the tensor."""


@dataclass(frozen=True)
class DecoderSpec:
    """The shape of a supported decoder, read from an HF config."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tied_embeddings: bool
    qk_norm: bool
    qkv_bias: bool

    def padded_vocab(self, tp: int) -> int:
        return -(-self.vocab_size // tp) * tp


def _rope_theta(cfg: dict) -> float:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise UnsupportedModelError(f"HF config: rope type {rope_type!r} (rope_parameters.rope_type) is not supported; only 'default' rotary")
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        raise UnsupportedModelError("HF config: no rope_theta (in rope_parameters or at the top level)")
    return float(theta)


def spec_from_hf_config(cfg: dict) -> DecoderSpec:
    """Read and check an HF `config.json` (as a dict); raise naming what cannot be mapped."""
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"HF config: model_type {model_type!r} is not supported by the Megatron converter "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"HF config: hidden_act {cfg['hidden_act']!r} is not supported (only 'silu', SwiGLU)")
    if cfg.get("use_sliding_window") or (model_type == "llama" and cfg.get("sliding_window")):
        raise UnsupportedModelError("HF config: use_sliding_window is set; sliding-window attention is not supported")
    if cfg.get("mlp_bias"):
        raise UnsupportedModelError("HF config: mlp_bias is set; MLP biases are not supported")
    if cfg.get("attention_bias") and model_type != "qwen2":
        raise UnsupportedModelError("HF config: attention_bias is set; only qkv biases of qwen2 are supported")
    for key in ("num_experts", "n_routed_experts"):
        if cfg.get(key):
            raise UnsupportedModelError(f"HF config: {key} is set; mixture-of-experts is not supported")
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise UnsupportedModelError(f"HF config: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    hidden = int(cfg["hidden_size"])
    return DecoderSpec(
        model_type=model_type,
        num_layers=int(cfg["num_hidden_layers"]),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        ffn_hidden_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=model_type == "qwen3",
        qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias")),
    )


def load_hf_dir(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a model directory's safetensors files, as float32."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise WeightShapeError(f"{model_dir}: no *.safetensors weights (the Megatron engine reads safetensors only)")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return {k: v.float() for k, v in tensors.items()}


def check_parallel(spec: DecoderSpec, tp: int, pp: int = 1) -> None:
    """Tensor parallelism must split heads, key/value groups and the MLP evenly; pipeline
    parallelism the layers (each stage holds num_hidden_layers / pp consecutive layers)."""
    for name, value in (("num_attention_heads", spec.num_heads), ("num_key_value_heads", spec.num_kv_heads),
                        ("intermediate_size", spec.ffn_hidden_size)):
        if value % tp:
            raise UnsupportedModelError(f"HF config: {name} {value} is not divisible by tensor parallel size {tp}")
    if spec.num_layers % pp:
        raise UnsupportedModelError(
            f"HF config: num_hidden_layers {spec.num_layers} is not divisible by pipeline parallel size {pp}")


def hf_names(spec: DecoderSpec) -> dict[str, tuple[int, ...]]:
    """Every HF tensor the model has, with its shape."""
    h, hd, v = spec.hidden_size, spec.head_dim, spec.vocab_size
    names: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not spec.tied_embeddings:
        names["lm_head.weight"] = (v, h)
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        names.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (spec.num_heads * hd, h),
            p + "self_attn.k_proj.weight": (spec.num_kv_heads * hd, h),
            p + "self_attn.v_proj.weight": (spec.num_kv_heads * hd, h),
            p + "self_attn.o_proj.weight": (h, spec.num_heads * hd),
            p + "mlp.gate_proj.weight": (spec.ffn_hidden_size, h),
            p + "mlp.up_proj.weight": (spec.ffn_hidden_size, h),
            p + "mlp.down_proj.weight": (h, spec.ffn_hidden_size),
        })
        if spec.qk_norm:
            names[p + "self_attn.q_norm.weight"] = (hd,)
            names[p + "self_attn.k_norm.weight"] = (hd,)
        if spec.qkv_bias:
            names[p + "self_attn.q_proj.bias"] = (spec.num_heads * hd,)
            names[p + "self_attn.k_proj.bias"] = (spec.num_kv_heads * hd,)
            names[p + "self_attn.v_proj.bias"] = (spec.num_kv_heads * hd,)
    return names


def check_hf_state(spec: DecoderSpec, state: dict[str, torch.Tensor]) -> None:
    """Every tensor present with its shape; a tied head may be absent or equal to the embedding."""
    expected = hf_names(spec)
    for name, shape in expected.items():
        if name not in state:
            raise WeightShapeError(f"HF weights: tensor {name!r} is missing (expected shape {list(shape)})")
        if tuple(state[name].shape) != shape:
            raise WeightShapeError(f"HF weights: tensor {name!r} has shape {list(state[name].shape)}, expected {list(shape)}")
    extra = sorted(set(state) - set(expected) - ({"lm_head.weight"} if spec.tied_embeddings else set()))
    if extra:
        raise WeightShapeError(f"HF weights: tensor {extra[0]!r} is not part of a {spec.model_type} model ({len(extra)} unexpected)")


def is_replicated(megatron_name: str) -> bool:
    """Every tensor-parallel rank holds the whole tensor (the norms); the rest are sharded."""
    return megatron_name.endswith("layernorm.weight")


def _rows(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    return t.chunk(tp, dim=0)[rank]


def _vocab_rows(t: torch.Tensor, spec: DecoderSpec, rank: int, tp: int) -> torch.Tensor:
    padded = spec.padded_vocab(tp)
    if padded != t.shape[0]:
        t = torch.cat([t, t.new_zeros(padded - t.shape[0], *t.shape[1:])])
    return _rows(t, rank, tp)


def _qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: DecoderSpec) -> torch.Tensor:
    """HF q/k/v (weights or biases) -> Megatron's per-group interleaved rows, all groups."""
    g, hd = spec.num_kv_heads, spec.head_dim
    per = spec.num_heads // g
    q = q.reshape(g, per * hd, *q.shape[1:])
    k = k.reshape(g, hd, *k.shape[1:])
    v = v.reshape(g, hd, *v.shape[1:])
    return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])


def _split_qkv(qkv: torch.Tensor, spec: DecoderSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, hd = spec.num_kv_heads, spec.head_dim
    per = spec.num_heads // g
    grouped = qkv.reshape(g, (per + 2) * hd, *qkv.shape[1:])
    q, k, v = grouped.split([per * hd, hd, hd], dim=1)
    return (q.reshape(-1, *qkv.shape[1:]), k.reshape(-1, *qkv.shape[1:]), v.reshape(-1, *qkv.shape[1:]))


def to_megatron(spec: DecoderSpec, hf: dict[str, torch.Tensor], rank: int = 0, tp: int = 1) -> dict[str, torch.Tensor]:
    """One tensor-parallel rank's Megatron state (GPTModel names, all layers) from HF tensors."""
    check_parallel(spec, tp)
    check_hf_state(spec, hf)
    out = {"embedding.word_embeddings.weight": _vocab_rows(hf["model.embed_tokens.weight"], spec, rank, tp),
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not spec.tied_embeddings:
        out["output_layer.weight"] = _vocab_rows(hf["lm_head.weight"], spec, rank, tp)
    for i in range(spec.num_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = p + "self_attn."
        out[m + "input_layernorm.weight"] = hf[p + "input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[p + "post_attention_layernorm.weight"]
        qkv = _qkv(hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"], spec)
        out[m + "self_attention.linear_qkv.weight"] = _rows(qkv, rank, tp)
        if spec.qkv_bias:
            bias = _qkv(hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"], spec)
            out[m + "self_attention.linear_qkv.bias"] = _rows(bias, rank, tp)
        if spec.qk_norm:
            out[m + "self_attention.q_layernorm.weight"] = hf[attn + "q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = hf[attn + "k_norm.weight"]
        out[m + "self_attention.linear_proj.weight"] = hf[attn + "o_proj.weight"].chunk(tp, dim=1)[rank]
        gate, up = hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([_rows(gate, rank, tp), _rows(up, rank, tp)])
        out[m + "mlp.linear_fc2.weight"] = hf[p + "mlp.down_proj.weight"].chunk(tp, dim=1)[rank]
    return {k: v.contiguous() for k, v in out.items()}


def to_hf(spec: DecoderSpec, shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Full HF tensors from every tensor-parallel rank's Megatron state, in rank order."""

    def rows(name: str) -> torch.Tensor:
        return torch.cat([s[name] for s in shards], dim=0)

    def cols(name: str) -> torch.Tensor:
        return torch.cat([s[name] for s in shards], dim=1)

    first = shards[0]
    out = {"model.embed_tokens.weight": rows("embedding.word_embeddings.weight")[: spec.vocab_size],
           "model.norm.weight": first["decoder.final_layernorm.weight"]}
    if not spec.tied_embeddings:
        out["lm_head.weight"] = rows("output_layer.weight")[: spec.vocab_size]
    for i in range(spec.num_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = p + "self_attn."
        out[p + "input_layernorm.weight"] = first[m + "input_layernorm.weight"]
        out[p + "post_attention_layernorm.weight"] = first[m + "pre_mlp_layernorm.weight"]
        q, k, v = _split_qkv(rows(m + "self_attention.linear_qkv.weight"), spec)
        out[attn + "q_proj.weight"], out[attn + "k_proj.weight"], out[attn + "v_proj.weight"] = q, k, v
        if spec.qkv_bias:
            q, k, v = _split_qkv(rows(m + "self_attention.linear_qkv.bias"), spec)
            out[attn + "q_proj.bias"], out[attn + "k_proj.bias"], out[attn + "v_proj.bias"] = q, k, v
        if spec.qk_norm:
            out[attn + "q_norm.weight"] = first[m + "self_attention.q_layernorm.weight"]
            out[attn + "k_norm.weight"] = first[m + "self_attention.k_layernorm.weight"]
        out[attn + "o_proj.weight"] = cols(m + "self_attention.linear_proj.weight")
        fc1 = [s[m + "mlp.linear_fc1.weight"].chunk(2, dim=0) for s in shards]
        out[p + "mlp.gate_proj.weight"] = torch.cat([g for g, _ in fc1])
        out[p + "mlp.up_proj.weight"] = torch.cat([u for _, u in fc1])
        out[p + "mlp.down_proj.weight"] = cols(m + "mlp.linear_fc2.weight")
    check_hf_state(spec, out)
    return {k: v.contiguous() for k, v in out.items()}


def stage_layers(spec: DecoderSpec, pp_rank: int, pp: int) -> range:
    """The (global) decoder layers pipeline stage `pp_rank` holds: an equal consecutive run."""
    per = spec.num_layers // pp
    return range(pp_rank * per, (pp_rank + 1) * per)


def _layer_index(name: str) -> int:
    return int(name.split(".")[2])


def to_stage(spec: DecoderSpec, state: dict[str, torch.Tensor], pp_rank: int, pp: int) -> dict[str, torch.Tensor]:
    """One pipeline stage's part of a TP shard with all layers (`to_megatron`'s output), named
    as that stage's GPTModel names it: `decoder.layers.{i - first}`. With a tied head and
    pp > 1 the last stage holds its own copy of the embedding as `output_layer.weight`."""
    if pp == 1:
        return state
    layers = stage_layers(spec, pp_rank, pp)
    first, last = pp_rank == 0, pp_rank == pp - 1
    out = {}
    for name, t in state.items():
        if name.startswith("decoder.layers."):
            i = _layer_index(name)
            if i in layers:
                out[name.replace(f"decoder.layers.{i}.", f"decoder.layers.{i - layers.start}.", 1)] = t
        elif (first if name.startswith("embedding.") else last):  # the final norm, an untied head
            out[name] = t
    if last and spec.tied_embeddings:
        out["output_layer.weight"] = state["embedding.word_embeddings.weight"]
    return out


def from_stages(spec: DecoderSpec, stages: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every pipeline stage's state of one TP rank, in stage order, joined into `to_megatron`'s
    all-layer names (a tied head's last-stage copy dropped: the embedding is the tensor)."""
    if len(stages) == 1:
        return stages[0]
    out = {}
    for pp_rank, state in enumerate(stages):
        start = stage_layers(spec, pp_rank, len(stages)).start
        for name, t in state.items():
            if name.startswith("decoder.layers."):
                i = _layer_index(name)
                out[name.replace(f"decoder.layers.{i}.", f"decoder.layers.{i + start}.", 1)] = t
            elif not (name == "output_layer.weight" and spec.tied_embeddings):
                out[name] = t
    return out
