"""Gradient reduction among the cells training at one moment: torch.distributed, one group per step.

The cells that train together change from step to step (the elastic policy moves cells
between rollout and train; a cell's process may die and come back), so there is no fixed
world. Each reduction makes a process group of exactly its members: the core (rank 0,
in the driver, which applies the optimizer step) and the satellites whose replicas hold
gradients for that step (ranks 1..n, in their actors). The ranks meet at one TCPStore
the driver serves for the whole run, under a prefix of their own per attempt
(`PrefixStore`), so a group never mixes with an earlier or a failed one, and none needs
the default process group. The backend is gloo for CPU tensors and NCCL for CUDA ones.

An attempt opens with a roll call on the store: each member says `ready` (it holds
gradients) or `declined` (it holds none: a process Ray restarted), and the core says `go`
only when every member is ready; otherwise `abort`, and the attempt is made again without
the decliners. So a restarted or dead member never leaves the others blocked in a group it
will not join. A member dying during the collective itself makes the others fail within
seconds (its sockets close).

The core reduces into a zeroed buffer, never into its own gradients, and adds the sum
to them only once every bucket has arrived: a reduction that fails because a member died
leaves the core's gradients as they were, so it can be tried again without that member.
A satellite keeps its gradients until the driver tells it to clear them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

BUCKET_BYTES = 32 * 1024 * 1024  # gradients travel in flat buffers of at most this many bytes
REDUCE_TIMEOUT_S = 60.0  # forming the group and each collective; a member that never joins fails it


class GradStore:
    """The run's rendezvous: a TCPStore served by the driver at `host:port` for every reduction."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=REDUCE_TIMEOUT_S))
        self.port = self.store.port
        self._attempts = 0

    def next_prefix(self, step: int) -> str:
        self._attempts += 1
        return f"reduce-step{step}-attempt{self._attempts}"

    def answers(self, prefix: str, ranks: list[int]) -> dict[int, str]:
        """The roll call so far: rank -> "ready" | "declined", for the ranks that answered."""
        out = {}
        for rank in ranks:
            key = f"{prefix}/roll/{rank}"
            if self.store.check([key]):
                out[rank] = self.store.get(key).decode()
        return out

    def decide(self, prefix: str, go: bool) -> None:
        self.store.set(f"{prefix}/go", "go" if go else "abort")


def answer(store: dist.Store, prefix: str, rank: int, ready: bool) -> bool:
    """A member's answer to the roll call; True when the core says go (wait at most the timeout)."""
    store.set(f"{prefix}/roll/{rank}", "ready" if ready else "declined")
    if not ready:
        return False
    store.wait([f"{prefix}/go"], timedelta(seconds=REDUCE_TIMEOUT_S))
    return store.get(f"{prefix}/go").decode() == "go"


def join(store: dist.Store, prefix: str, rank: int, size: int, host: str, device: torch.device):
    """This rank's process group for one reduction (`host`: the address its data sockets use)."""
    scoped = dist.PrefixStore(prefix, store)
    timeout = timedelta(seconds=REDUCE_TIMEOUT_S)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(scoped, rank, size, options)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(scoped, rank, size, options)


def client_store(host: str, port: int) -> dist.Store:
    """A satellite's connection to the driver's `GradStore`."""
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=REDUCE_TIMEOUT_S))


def send_gradients(group, params: list[torch.nn.Parameter]) -> None:
    """A satellite's part: its gradients (zeros where it has none), summed onto rank 0."""
    send_tensors(group, [_grad(p) for p in params])


def send_tensors(group, grads: list[torch.Tensor]) -> None:
    """A satellite's part when its gradients are not its parameters' own (a tensor-parallel cell
    sends full tensors in the core's layout): one tensor per core parameter, in order and shape."""
    for bucket in _buckets(grads):
        flat = torch.cat([g.to(torch.float32).reshape(-1) for g in bucket])
        _reduce(group, flat)


def receive_sum(group, params: list[torch.nn.Parameter]) -> list[tuple[list, torch.Tensor]]:
    """The core's part: the members' summed gradients, bucket by bucket, not yet applied."""
    sums = []
    for bucket in _buckets(params):
        flat = torch.zeros(sum(p.numel() for p in bucket), dtype=torch.float32, device=bucket[0].device)
        _reduce(group, flat)
        sums.append((bucket, flat))
    return sums


def add_sum(sums: list[tuple[list, torch.Tensor]]) -> None:
    """Add what `receive_sum` received to the core's gradients."""
    for bucket, flat in sums:
        offset = 0
        for p in bucket:
            part = flat[offset:offset + p.numel()].view_as(p).to(p.dtype)
            offset += p.numel()
            if p.grad is None:
                p.grad = part.clone()
            else:
                p.grad.add_(part)


def _reduce(group, flat: torch.Tensor) -> None:
    options = dist.ReduceOptions()
    options.rootRank = 0
    options.reduceOp = dist.ReduceOp.SUM
    group.reduce([flat], options).wait()


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    return (p.grad if p.grad is not None else torch.zeros_like(p)).to(torch.float32)


def _buckets(params: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """The parameters in order, grouped so each group's fp32 gradients fit BUCKET_BYTES (one
    larger parameter gets a group of its own). Every rank sees the same model: the same buckets."""
    bucket, size = [], 0
    for p in params:
        nbytes = p.numel() * 4
        if bucket and size + nbytes > BUCKET_BYTES:
            yield bucket
            bucket, size = [], 0
        bucket.append(p)
        size += nbytes
    if bucket:
        yield bucket
