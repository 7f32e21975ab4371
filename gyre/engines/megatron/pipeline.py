"""Pipeline parallelism (pp > 1) for the Megatron train engine, on Megatron's own 1F1B schedule.

Why it exists: with `train.megatron.pp > 1` each rank holds one pipeline stage (a run of
num_layers / pp layers; the embedding on the first stage, the final norm and head on the last,
engines/megatron_setup.py builds it), so a micro-batch's forward runs stage after stage and its
backward back again. `forward_backward` drives megatron-core's non-interleaved 1F1B schedule
(`get_forward_backward_func()` with pp > 1: `forward_backward_pipelining_without_interleaving`)
with the engine's packed rows as micro-batches: every stage of a pipeline `_collate`s the same
rows (same masks and positions: the later stages need them too), the first stage embeds the
tokens, the last computes `token_logprobs` and the algorithm's loss (each micro-batch's loss
taken as it is, `calculate_per_token_loss`: no division by micro-batches or tokens), and the
loss and stats are broadcast from the last stage to the whole pipeline.

CPU (gloo): handled here, only when the model is on the CPU (1) or CUDA is absent (2), never
outside this module (the build's tied-head copy is `megatron_setup._no_embedding_sync`):
(1) `P2PCommunicator._communicate` allocates its receive buffers and shape messages on
`torch.cuda.current_device()` and calls `torch.cuda.synchronize()`: `_CpuP2P` subclasses it
with CPU buffers over plain isend/recv (each activation or gradient preceded by its shape:
micro-batches differ in rows and width), handed to the schedule as its `p2p_communicator`;
(2) the schedule counts tokens in `torch.zeros([], device="cuda")`: `_CudaFactoriesOnCpu`, a
`TorchFunctionMode` active only during the schedule call, makes factories asked for "cuda"
make CPU tensors. Megatron's `finalize_model_grads` is not used (it reduces its DDP wrapper's
`main_grad` buffers, which this engine does not have): the two copies of a tied embedding
(first stage's embedding, last stage's head) get their gradients summed over Megatron's
embedding group by `reduce_embedding_grads`, as `finalize_model_grads` does.
"""

from __future__ import annotations

import contextlib
from functools import cache, partial

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from gyre.engines.torch.train import _collate, token_logprobs


class _CudaFactoriesOnCpu(TorchFunctionMode):
    """Tensor factories called with device="cuda" make CPU tensors (the schedule's token count)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


@cache
def _p2p_class():
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    class _CpuP2P(P2PCommunicator):
        """Megatron's stage-to-stage messages with CPU buffers: every send is posted before any
        receive (gloo's isend progresses on its own thread), a tensor follows its 3-d shape."""

        def _communicate(self, *, tensor_send_next, tensor_send_prev, recv_prev, recv_next,
                         tensor_shape=None, wait_on_reqs=True):
            works, keep = [], []  # send buffers stay alive until their sends complete
            for tensor, peer in ((tensor_send_next, self.next_rank), (tensor_send_prev, self.prev_rank)):
                if tensor is not None:
                    data = tensor.detach().contiguous()
                    assert data.dim() == 3, f"pipeline message of shape {list(data.shape)}: [T, B, H] expected"
                    shape = torch.tensor(data.shape, dtype=torch.int64)
                    keep += [shape, data]
                    works += [dist.isend(t, dst=peer, group=self.pp_group) for t in (shape, data)]
            received = []
            for wanted, peer in ((recv_prev, self.prev_rank), (recv_next, self.next_rank)):
                if not wanted:
                    received.append(None)
                    continue
                shape = torch.empty(3, dtype=torch.int64)
                dist.recv(shape, src=peer, group=self.pp_group)
                data = torch.empty(shape.tolist(), dtype=self.config.pipeline_dtype)
                dist.recv(data, src=peer, group=self.pp_group)
                received.append(data.requires_grad_())
            for work in works:
                work.wait()
            return received[0], received[1], None

    return _CpuP2P


def forward_backward(engine, batches: list, micro_loss) -> tuple[float, float, int, dict]:
    """One pipeline pass over this data-parallel replica's micro-batches (the same list on
    every stage): gradients of the summed loss on each stage's parameters, and the last
    stage's (loss, |logp - behaviour| sum, trained tokens, stat sums) on every stage.
    `micro_loss(cols, logp, sums)` is the engine's per-micro-batch loss (it adds to `sums`)."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.process_groups_config import ProcessGroupCollection

    model = engine.model
    sums = [0.0, 0.0, 0, {}]
    cols_list = [{k: v.to(engine.device) for k, v in _collate(b, engine.pad_id, "mask").items()} for b in batches]

    def loss_func(cols, logp_BT):
        loss = micro_loss(cols, logp_BT, sums)
        return loss, torch.tensor(int(cols["mask"].sum()), dtype=torch.int), {}

    def forward_step(data_iterator, _model):
        cols = next(data_iterator)
        if not model.post_process:  # this stage's output hidden states [T, B, H], sent on
            return engine._forward(cols["input_ids"], cols["attention"], cols.get("position_ids")), None
        logp_BT = token_logprobs(engine._forward, cols["input_ids"], cols["attention"], engine.temperature,
                                 cols.get("position_ids"), cols.get("prev"))
        return logp_BT, partial(loss_func, cols)

    if cols_list:
        pp_group = ps.get_pipeline_model_parallel_group()
        pgs = ProcessGroupCollection()
        pgs.tp, pgs.pp, pgs.cp = ps.get_tensor_model_parallel_group(), pp_group, ps.get_context_parallel_group()
        pgs.embd = ps.get_embedding_group(check_initialized=False)
        pgs.pos_embd = ps.get_position_embedding_group(check_initialized=False)
        pgs.dp_cp = ps.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=False)
        p2p = (_p2p_class() if engine.device.type == "cpu" else P2PCommunicator)(pp_group=pp_group, config=model.config)
        schedule = get_forward_backward_func()
        with _CudaFactoriesOnCpu() if not torch.cuda.is_available() else contextlib.nullcontext():
            schedule(
                forward_step_func=forward_step, data_iterator=iter(cols_list), model=[model],
                num_microbatches=len(cols_list),
                seq_length=max(c["input_ids"].shape[1] for c in cols_list),
                micro_batch_size=max(c["input_ids"].shape[0] for c in cols_list),
                forward_only=False, p2p_communicator=p2p, pg_collection=pgs,
            )
    out = [tuple(sums)]
    dist.broadcast_object_list(out, src=ps.get_pipeline_model_parallel_last_rank(),
                               group=ps.get_pipeline_model_parallel_group())
    return out[0]


def reduce_embedding_grads(engine) -> None:
    """A tied embedding with pp > 1: the first stage's embedding and the last stage's head are
    two copies of one tensor; each gets the sum of both gradients (over Megatron's embedding
    group, first and last stage of this pipeline), so their updates stay equal."""
    from megatron.core import parallel_state as ps

    if engine.parallel.pp == 1 or not engine.spec.tied_embeddings or not ps.is_rank_in_embedding_group():
        return
    weight = engine.model.shared_embedding_or_output_weight()
    if weight.grad is None:
        weight.grad = torch.zeros_like(weight)
    dist.all_reduce(weight.grad, group=ps.get_embedding_group())


def is_tied_copy(engine, name: str) -> bool:
    """The last stage's copy of a tied embedding (counted once: the first stage's is the tensor)."""
    return engine.parallel.pp > 1 and engine.spec.tied_embeddings and name == "output_layer.weight"
