"""The safetensors file path of weights: how a new policy gets from the train engine to in-process engines.

`FileSnapshotTransport` is the reference: the train engine writes a safetensors snapshot
(write, then rename, so a reader never sees half a file) and each rollout engine loads it
between batches with the new policy version. The driver publishes through it every step; the
cells' Ray actors load the same file by path (`scheduler.weight_transport: disk`) or pull a
checksummed snapshot over one of `gyre.weights`' transports (`gyre/weights/base.py`). It sits
with the engines because it moves weights between them by their own save and load.
"""

from __future__ import annotations

from pathlib import Path

from gyre.engines.base import RolloutEngine, TrainEngine


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
