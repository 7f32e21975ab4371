"""Weight transport by torch.distributed broadcast (gloo on CPU, NCCL on GPU).

When the train and rollout processes already form (or can form) a process group, the
fastest way to hand every reader the new weights is one broadcast from the publisher's
rank: NCCL over NVLink/InfiniBand on a cluster, gloo over TCP on a CPU box. The publisher
is rank `src`; every other rank is a reader.

Each publication is two collectives: the manifest (`broadcast_object_list`), then the flat
buffer (`broadcast`) into a buffer of exactly the manifest's size. Being collectives, every
rank in the group takes part in every publication, in order: a reader's `pull` receives
publications until one reaches `min_version` (older ones are dropped), and the publisher's
`publish` returns once the buffer has been sent. Its timeout is the process group's.

Why a reader never returns half a snapshot: a broadcast returns only when the whole buffer
has arrived (or raises), and the checksum is verified afterwards regardless, so a buffer
damaged in transit is refused (`ChecksumMismatchError`), never loaded.

With NCCL the buffer travels on the rank's current CUDA device and is copied back to the
host to verify it. Broadcasting straight into the rollout engine's parameters (no host
copy) is the next step on a GPU cluster and is not done here.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from gyre.weights.base import DEFAULT_PULL_TIMEOUT_S, PullClock, Pulled, WrongRoleError
from gyre.weights.snapshot import Manifest, Snapshot


def init_group(
    rank: int,
    world_size: int,
    port: int,
    backend: str = "gloo",
    host: str = "127.0.0.1",
    timeout_s: float = DEFAULT_PULL_TIMEOUT_S,
) -> None:
    """Join the default process group over TCP at `host:port` (rank 0 listens there).

    With gloo on one box set `GLOO_SOCKET_IFNAME=lo` so its data sockets stay on loopback.
    """
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


class DistTransport:
    """This rank's end of a broadcast transport over `group` (default: the default group)."""

    name = "dist"

    def __init__(self, src: int = 0, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("DistTransport needs an initialised process group (gyre.weights.dist.init_group)")
        self.group = group
        self.src = src
        self.rank = dist.get_rank()
        self.publisher = self.rank == src
        backend = dist.get_backend(group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def publish(self, snapshot: Snapshot) -> None:
        if not self.publisher:
            raise WrongRoleError(f"rank {self.rank} is a reader; rank {self.src} publishes")
        dist.broadcast_object_list([snapshot.manifest.to_json()], src=self.src, group=self.group, device=self.device)
        dist.broadcast(snapshot.buffer.to(self.device), src=self.src, group=self.group)

    def pull(self, min_version: int = 0, timeout_s: float = DEFAULT_PULL_TIMEOUT_S) -> Pulled:
        """Take part in publications until one has version >= `min_version`.

        `timeout_s` is not used: each collective waits up to the group's timeout
        (`init_group(timeout_s=...)`), after which torch.distributed raises.
        """
        if self.publisher:
            raise WrongRoleError(f"rank {self.rank} publishes; it cannot pull")
        clock = PullClock()
        while True:
            box: list[object] = [None]
            dist.broadcast_object_list(box, src=self.src, group=self.group, device=self.device)
            manifest = Manifest.from_json(box[0])  # type: ignore[arg-type]
            buffer = torch.empty(manifest.nbytes, dtype=torch.uint8, device=self.device)
            dist.broadcast(buffer, src=self.src, group=self.group)
            if manifest.version < min_version:
                continue
            snapshot = Snapshot(manifest, buffer.cpu() if buffer.is_cuda else buffer)
            snapshot.verify()
            return clock.record(self.name, snapshot)

    def close(self) -> None:
        """The process group is the caller's; nothing to release here."""
