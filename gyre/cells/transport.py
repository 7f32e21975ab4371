"""Weight transport: how a new policy gets from the train engine to rollout engines.

`FileSnapshotTransport` is the reference: the train engine writes a safetensors snapshot
(write, then rename, so a reader never sees half a file) and each rollout engine loads it
between batches with the new policy version. On a cluster the same interface is backed by
the Mooncake Transfer Engine over RDMA (or torch.distributed), imported only in its own
backend module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from gyre.engines.base import RolloutEngine, TrainEngine


class WeightTransport(Protocol):
    def publish(self, trainer: TrainEngine, engines: list[RolloutEngine], version: int) -> None: ...


class FileSnapshotTransport:
    def __init__(self, snapshot_dir: Path, keep: int = 2) -> None:
        self.snapshot_dir = Path(snapshot_dir)
        self.keep = keep

    def publish(self, trainer: TrainEngine, engines: list[RolloutEngine], version: int) -> Path:
        path = trainer.save_snapshot(self.snapshot_dir / f"policy-v{version:06d}.safetensors")
        for engine in engines:
            engine.load_weights(path, version)
        for old in sorted(self.snapshot_dir.glob("policy-v*.safetensors"))[: -self.keep]:
            old.unlink()
        return path

    def latest(self) -> Path:
        """The newest published snapshot (a cell returning to rollout loads it)."""
        snapshots = sorted(self.snapshot_dir.glob("policy-v*.safetensors"))
        if not snapshots:
            raise FileNotFoundError(f"{self.snapshot_dir}: no snapshot has been published yet")
        return snapshots[-1]
