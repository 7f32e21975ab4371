"""The Megatron-core train engine (`pip install gyre-rl[megatron]`).

Why it exists: the torch reference engine holds one full replica per process; a cluster
trains models that only fit split across accelerators. This engine builds Megatron-core's
`GPTModel` from a Hugging Face config (engines/megatron_convert.py maps the weights both
ways), splits it with tensor parallelism over `torch.distributed`, and otherwise behaves as
`TorchTrainEngine` does for the coordinator: `forward_backward` on the trajectory
processor's packed rows with the algorithm's loss (plain and tree-packed rows, the same
`_collate` and `token_logprobs`), `apply_gradients` (global grad-norm clip, AdamW),
`save_snapshot` in HF tensor names that the rollout engines load, `steps_taken`.

Parallelism: `MegatronParallel(tp, pp)`; data parallelism is what the world leaves (world =
tp * pp * dp). Every rank calls every method with the same arguments; a data-parallel
replica takes every dp-th row; a call's fresh gradients are summed over data-parallel ranks
(the loss is a sum), for the q/k norms (applied to each rank's own heads) over the
tensor-parallel group and, for a tied embedding with pp > 1, over its two copies (first and
last stage), as Megatron's `finalize_model_grads` does. Pipeline parallelism (pp > 1): each
rank builds and holds its stage's layers only and `forward_backward` runs Megatron's own
1F1B schedule (engines/megatron_pipeline.py); the grad-norm clip is global over all stages
and shards; stats are the same on every rank. Megatron's DDP wrapper and optimizer assume
CUDA and are not used: plain AdamW on each rank's shard is the same update.

CPU (gloo): megatron-core 0.16 assumes CUDA where this engine reaches it; all handled here,
only when CUDA is absent, never outside this module: (1) `GlobalMemoryBuffer.get_tensor`
(attention's scratch buffer, shared process-wide) allocates on `torch.cuda.current_device()`:
patched once (`_patch_for_cpu`) to allocate a fresh CPU tensor (thread-safe); (2) the RNG tracker is seeded by
`model_parallel_cuda_manual_seed` (CUDA only): the engine calls
`initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)` instead (dropout is
0, no stream is drawn). Without patches: the default causal mask and `RotaryEmbedding.forward`
also go to "cuda", so the engine passes its own mask and rotary angles (which is also what
tree rows need: depth positions, ancestor-only masks); Megatron's vocabulary gather
allocates on CUDA, so the logits are gathered by `_GatherVocab`. Pipeline parallelism adds
three (the tied head's copy at build, the p2p buffers, the schedule's token count), listed
in engines/megatron_pipeline.py and megatron_setup.py, patched only there.

Megatron's parallel state is global to a process: engines in one process share it and must
agree on tp and pp. With no process group, the engine starts a one-process gloo group.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from gyre.algo.gspo import is_summed
from gyre.engines.base import LossFn, TrainStats
from gyre.engines.megatron import bootstrap as setup
from gyre.engines.megatron import convert as conv
from gyre.engines.megatron import pipeline as pipe
from gyre.engines.megatron.bootstrap import _SHARED_BUFFER, MegatronParallel, _build_model, _GatherVocab, _init_parallel  # noqa: F401 - MegatronParallel is part of this module's API
from gyre.engines.models.hf import check_model_dir
from gyre.engines.torch.train import NonFiniteError, _check, _collate, micro_batches, token_logprobs
from gyre.trajectories.rows import TrainSequence


class MegatronTrainEngine:
    """A `TrainEngine` on Megatron-core: this rank's shard of the model and its AdamW state."""

    def __init__(
        self,
        model_dir: Path,
        *,
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        grad_clip: float = 1.0,
        micro_batch_tokens: int = 8192,
        temperature: float = 1.0,
        seed: int = 0,
        parallel: MegatronParallel = MegatronParallel(),
        device: str = "cpu",
    ) -> None:
        model_dir = check_model_dir(Path(model_dir))
        hf_config = json.loads((model_dir / "config.json").read_text())
        self.spec = conv.spec_from_hf_config(hf_config)
        conv.check_parallel(self.spec, parallel.tp, parallel.pp)
        torch.manual_seed(seed)
        _init_parallel(parallel)
        from megatron.core import parallel_state as ps

        setup._engines_alive += 1
        self._closed = False
        self.parallel = parallel
        self.tp_rank, self.tp_group = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_group()
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.dp_group = ps.get_data_parallel_group()
        self.pp_rank, self.mp_group = ps.get_pipeline_model_parallel_rank(), ps.get_model_parallel_group()
        self.device = torch.device(device)
        try:
            self.model = _build_model(self.spec, parallel.tp, parallel.pp).to(self.device)
            self.load_hf_state(conv.load_hf_dir(model_dir))
        except BaseException:
            self.close()
            raise
        self.pad_id = int(hf_config.get("pad_token_id") or 0)
        self.grad_clip = grad_clip
        self.micro_batch_tokens = micro_batch_tokens
        self.temperature = temperature
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
        self.steps_taken = 0
        self.model.eval()

    # -- weights -----------------------------------------------------------------------

    def load_hf_state(self, hf: dict[str, torch.Tensor]) -> None:
        """Set this rank's shard from full HF tensors; all shapes are checked before any copy
        (errors name the tensor), so a refused state leaves the weights as they were."""
        shard = conv.to_stage(self.spec, conv.to_megatron(self.spec, hf, self.tp_rank, self.parallel.tp),
                              self.pp_rank, self.parallel.pp)
        params = dict(self.model.named_parameters())
        for name in sorted(set(params) | set(shard)):
            have, want = shard.get(name), params.get(name)
            if have is None or want is None or have.shape != want.shape:
                raise conv.WeightShapeError(
                    f"megatron tensor {name!r}: converted {None if have is None else list(have.shape)}, "
                    f"model parameter {None if want is None else list(want.shape)}")
        with torch.no_grad():
            for name, tensor in shard.items():
                params[name].copy_(tensor)

    def load_snapshot(self, path: Path) -> None:
        """Load an HF-named safetensors snapshot (e.g. `save_snapshot`'s); a tensor that is
        missing, unknown or of the wrong shape is refused whole, naming it."""
        from safetensors.torch import load_file

        try:
            self.load_hf_state({k: v.float() for k, v in load_file(str(path)).items()})
        except conv.WeightShapeError as exc:
            raise conv.WeightShapeError(f"snapshot {path}: {exc}") from None

    def _gather_hf(self, which: str) -> dict[str, torch.Tensor]:
        """Full HF-named tensors (weights or gradients) gathered over the model-parallel group
        (every tensor-parallel shard of every pipeline stage); every rank gets the whole model."""
        local = {}
        for name, p in self.model.named_parameters():
            t = p.detach() if which == "weights" else (p.grad if p.grad is not None else torch.zeros_like(p))
            local[name] = t.detach().cpu().clone()
        tp, pp = self.parallel.tp, self.parallel.pp
        if tp * pp == 1:
            return conv.to_hf(self.spec, [local])
        parts: list = [None] * (tp * pp)
        dist.all_gather_object(parts, (self.pp_rank, self.tp_rank, local), group=self.mp_group)
        by_rank = {(p, t): state for p, t, state in parts}
        return conv.to_hf(self.spec, [conv.from_stages(self.spec, [by_rank[p, t] for p in range(pp)]) for t in range(tp)])

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The full model's weights in HF names on every rank; a collective over the TP x PP group."""
        return self._gather_hf("weights")

    def hf_gradients(self) -> dict[str, torch.Tensor]:
        """The held gradients in HF names (zeros where none), full on every rank; a collective
        over the TP x PP group."""
        return self._gather_hf("grads")

    def save_snapshot(self, path: Path) -> Path:
        """Write the weights in HF names as safetensors (write, then rename); the rank with
        tensor-, pipeline- and data-parallel rank 0 writes, every rank returns once it is there."""
        from safetensors.torch import save_file

        path = Path(path)
        state = self.hf_state_dict()
        if self.tp_rank == 0 and self.pp_rank == 0 and self.dp_rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            os.close(fd)
            try:
                save_file(state, tmp, metadata={"format": "pt"})
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        if dist.get_world_size() > 1:
            dist.barrier()
        return path

    def copy_weights_from(self, other: "MegatronTrainEngine") -> None:
        """Take another replica's weights (same process, same parallel layout)."""
        with torch.no_grad():
            for mine, theirs in zip(self.model.parameters(), other.model.parameters(), strict=True):
                mine.copy_(theirs)

    def add_gradients_from(self, other: "MegatronTrainEngine") -> None:
        """Add a replica's gradients into this one's and clear the replica's."""
        for mine, theirs in zip(self.model.parameters(), other.model.parameters(), strict=True):
            if theirs.grad is None:
                continue
            mine.grad = theirs.grad.detach().clone() if mine.grad is None else mine.grad.add_(theirs.grad)
        other.optimizer.zero_grad(set_to_none=True)

    # -- training ----------------------------------------------------------------------

    @property
    def pair_cost(self) -> float:
        """The tree packer's cost model, as `TorchTrainEngine`'s with "mask": attention here is
        dense over the row's mask, so a tree row pays every pair."""
        s = self.spec
        params = sum(math.prod(shape) for shape in conv.hf_names(s).values())
        return 4 * s.num_layers * s.num_heads * s.head_dim / (2 * params)

    def _forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        """HF-style call for `token_logprobs`: logits [B, T, vocab], gathered over TP. A pipeline
        stage before the last returns its hidden states [T, B, H]; a stage after the first
        starts from the input Megatron's schedule set (`set_input_tensor`), not `input_ids`."""
        rows, width = input_ids.shape
        if attention_mask is not None and attention_mask.dim() == 4:
            masked = attention_mask < 0  # tree rows: additive float mask from _collate
        else:
            causal = torch.ones(width, width, dtype=torch.bool, device=input_ids.device).triu(1)
            masked = causal.expand(rows, 1, width, width)
        if position_ids is None:
            position_ids = torch.arange(width, device=input_ids.device).expand(rows, width)
        m = self.model
        hidden = m.embedding(input_ids=input_ids, position_ids=position_ids) if m.pre_process else None  # [T, B, H]
        # RotaryEmbedding.forward moves its frequencies to CUDA; its CUDA-free half is enough:
        # angles per position, [cos | sin] halves (not interleaved), indexed by each token's position
        # (its `inv_freq` is made on the CPU with `use_cpu_initialization` and is no buffer, so
        # `.to("cuda")` leaves it there: the angles are moved to the activations' device)
        freqs = m.rotary_pos_emb.get_freqs_non_repeated(int(position_ids.max()) + 1).to(self.device)  # [S, D/2]
        rotary = torch.cat((freqs, freqs), dim=-1)[position_ids.transpose(0, 1)].unsqueeze(2)  # [T, B, 1, D]
        with _SHARED_BUFFER if setup._engines_alive > 1 and not setup._patched else contextlib.nullcontext():
            hidden = m.decoder(hidden_states=hidden, attention_mask=masked, rotary_pos_emb=rotary)
        if not m.post_process:
            return hidden
        weight = m.shared_embedding_or_output_weight() if self.spec.tied_embeddings else None
        logits, _ = m.output_layer(hidden, weight=weight, runtime_gather_output=False)  # [T, B, V / tp]
        if self.parallel.tp > 1:
            logits = _GatherVocab.apply(logits, self.tp_group)
        return SimpleNamespace(logits=logits[..., : self.spec.vocab_size].transpose(0, 1))

    def _reduce_fresh_grads(self) -> None:
        """This call's gradients: a tied embedding's two pipeline copies summed, q/k norms
        summed over TP ranks, everything over DP ranks."""
        pipe.reduce_embedding_grads(self)
        if self.parallel.tp > 1 and self.spec.qk_norm:
            for name, p in self.model.named_parameters():
                if p.grad is not None and ("q_layernorm" in name or "k_layernorm" in name):
                    dist.all_reduce(p.grad, group=self.tp_group)
        if self.dp_size > 1:
            for p in self.model.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, group=self.dp_group)

    @staticmethod
    def _micro_loss(loss_fn: LossFn, cols: dict, logp_BT: torch.Tensor, sums: list) -> torch.Tensor:
        """One micro-batch's loss; adds its loss, |logp - behaviour|, tokens and stats to `sums`."""
        loss, stats = loss_fn(logp_BT, cols["behaviour"], cols["mask"], cols["weight"], cols["advantage"], cols["segment"])
        mask = cols["mask"]
        sums[0] += float(loss.detach())
        sums[1] += float((logp_BT.detach() - cols["behaviour"]).abs()[mask].sum())
        sums[2] += int(mask.sum())
        rows = mask.shape[0]
        for key, value in stats.items():
            sums[3][key] = sums[3].get(key, 0.0) + (value if is_summed(key) else value * rows)
        return loss

    def forward_backward(self, sequences: list[TrainSequence], loss_fn: LossFn, accumulate: bool = False) -> TrainStats:
        """As `TorchTrainEngine.forward_backward`: gradients of the loss, no clip, no step.
        Stats cover every data-parallel rank's rows."""
        if not sequences:
            raise ValueError("forward_backward needs at least one sequence")
        for seq in sequences:
            _check(seq)
        self.model.train()
        params = list(self.model.parameters())
        held = [p.grad for p in params] if accumulate else [None] * len(params)
        for p in params:
            p.grad = None
        mine = sequences[self.dp_rank :: self.dp_size]
        batches = micro_batches(mine, self.micro_batch_tokens) if mine else []
        micro_loss = functools.partial(self._micro_loss, loss_fn)
        if self.parallel.pp > 1:
            sums = pipe.forward_backward(self, batches, micro_loss)
        else:
            sums = [0.0, 0.0, 0, {}]
            for batch in batches:
                cols = {k: v.to(self.device) for k, v in _collate(batch, self.pad_id, "mask").items()}
                logp_BT = token_logprobs(
                    self._forward, cols["input_ids"], cols["attention"], self.temperature,
                    cols.get("position_ids"), cols.get("prev"),
                )
                micro_loss(cols, logp_BT, sums).backward()
        total_loss, abs_diff_sum, num_trained, extra_sums = sums
        self._reduce_fresh_grads()
        if self.dp_size > 1:  # as objects: a replica with no rows has no stat keys
            gathered: list = [None] * self.dp_size
            dist.all_gather_object(gathered, (total_loss, abs_diff_sum, num_trained, extra_sums), group=self.dp_group)
            total_loss, abs_diff_sum, num_trained = (sum(g[i] for g in gathered) for i in range(3))
            extra_sums = {k: sum(g[3].get(k, 0.0) for g in gathered) for g in gathered for k in g[3]}
        if not math.isfinite(total_loss):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(f"loss is {total_loss}; step skipped, weights unchanged")
        for p, old in zip(params, held):
            if old is not None:
                p.grad = old if p.grad is None else p.grad.add_(old)
        return TrainStats(
            loss=total_loss, grad_norm=0.0, logprob_abs_diff=abs_diff_sum / max(num_trained, 1),
            tokens_trained=num_trained,
            extra={k: v if is_summed(k) else v / len(sequences) for k, v in extra_sums.items()},
        )

    def grad_norm(self) -> float:
        """Global L2 norm of the held gradients: sharded tensors counted once per shard,
        replicated ones (the norms) once, a tied embedding's last-stage copy not at all (a
        collective over the TP x PP group). By name: with `perform_initialization=False`
        Megatron never sets its `tensor_model_parallel` flag."""
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for name, p in self.model.named_parameters():
            if p.grad is None or pipe.is_tied_copy(self, name):
                continue
            if not conv.is_replicated(name) or self.tp_rank == 0:
                sq += p.grad.detach().double().pow(2).sum()
        if self.parallel.tp * self.parallel.pp > 1:
            dist.all_reduce(sq, group=self.mp_group)
        return float(sq.sqrt())

    def apply_gradients(self) -> float:
        """Clip the held gradients to `grad_clip` (global norm), one AdamW step, clear them."""
        norm = self.grad_norm()
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(f"gradient norm is {norm}; step skipped, weights unchanged")
        coef = min(self.grad_clip / (norm + 1e-6), 1.0)
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(coef)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.steps_taken += 1
        return norm

    def train_step(self, sequences: list[TrainSequence], loss_fn: LossFn) -> TrainStats:
        stats = self.forward_backward(sequences, loss_fn)
        stats.grad_norm = self.apply_gradients()
        return stats

    def close(self) -> None:
        """Release Megatron's parallel state (and the one-process group it started) once the
        last engine of this process closes."""
        if self._closed:
            return
        self._closed = True
        setup._engines_alive -= 1
        if setup._engines_alive == 0:
            from megatron.core import parallel_state as ps

            ps.destroy_model_parallel()
            if setup._owned_group and dist.is_initialized():
                dist.destroy_process_group()
                setup._owned_group = False
