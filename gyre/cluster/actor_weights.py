"""How a new policy reaches the rollout cells' actors: a shared disk, shared memory or Mooncake.

`scheduler.weight_transport` picks it for a `scheduler.runtime: ray` run:

- `disk`: the publication's safetensors file, loaded by the actor's server from the path the
  driver names (`/update_weights_from_disk`, as for an SGLang server): cells on one host, or
  hosts sharing a filesystem.
- `shm`: the driver publishes each version as a checksummed snapshot into a POSIX
  shared-memory segment (`gyre.weights.shm`, two slots and a seqlock); each actor attaches
  once and pulls the version it is told to. One host.
- `mooncake`: the same over the Mooncake Transfer Engine (`gyre.weights.mooncake`, TCP here,
  RDMA where it exists), announced by a descriptor file (so hosts must share the descriptor's
  directory). Across hosts: each end's engine is on its Ray node's address, the driver's segment
  named by its own, so an actor on another host reads it over the network.
- `ray`: the same through Ray's object store (`gyre.weights.ray_store`): one object per
  version, found through a named board actor. Across the hosts of the run's Ray.

On the driver a cell's engine is an `ActorEngine`: the SGLang adapter for generation, whose
`load_weights` asks the actor to pull instead of naming a file. Every pull comes back as a
`PullRecord` (bytes, seconds, attempts) that the run writes to `weight_pulls`.
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from dataclasses import asdict
from pathlib import Path

import torch

from gyre.engines.sglang.adapter import SGLangRolloutEngine

TRANSPORTS = ("disk", "shm", "mooncake", "ray")
PULL_TIMEOUT_S = 120.0  # an actor told to pull version v waits this long for it to be published


class WeightsChannel:
    """The driver's end: publishes every version to the actors (nothing to do for `disk`)."""

    def __init__(self, kind: str) -> None:
        if kind not in TRANSPORTS:
            raise ValueError(f"scheduler.weight_transport {kind!r}: one of {', '.join(TRANSPORTS)}")
        self.kind = kind
        self.where: str | None = None  # what an actor attaches to: a segment name or a descriptor path
        self._publisher = None
        self._dir: Path | None = None
        self.pulls: list[dict] = []  # PullRecords (as dicts, with engine_id) not yet written
        self._lock = threading.Lock()

    def open(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Create the publisher sized for `state` and publish it as `version` (before any actor starts)."""
        if self.kind == "disk":
            return
        from gyre.weights.snapshot import from_state_dict

        snapshot = from_state_dict(state, version)
        if self.kind == "shm":
            from gyre.weights.shm import ShmTransport, slot_bytes_for

            self.where = f"gyre-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self._publisher = ShmTransport.create(self.where, slot_bytes_for(snapshot))
        elif self.kind == "ray":
            from gyre.weights.ray_store import RayObjectTransport

            self.where = f"gyre-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self._publisher = RayObjectTransport.create(self.where)
        else:
            from gyre.weights.mooncake import MooncakeTransport

            self._dir = Path(tempfile.mkdtemp(prefix="gyre-mooncake-"))
            self.where = str(self._dir / "descriptor.json")
            # the segment is named by this node's address: actors on other hosts read it over the network
            self._publisher = MooncakeTransport.create(Path(self.where), snapshot.nbytes, host=_node_address())
        self._publisher.publish(snapshot)

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        if self._publisher is not None:
            from gyre.weights.snapshot import from_state_dict

            self._publisher.publish(from_state_dict(state, version))

    def record(self, engine_id: str, record: dict) -> None:
        with self._lock:
            self.pulls.append({"engine_id": engine_id, **record})

    def take(self) -> list[dict]:
        with self._lock:
            taken, self.pulls = self.pulls, []
        return taken

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None
        if self._dir is not None:
            import shutil

            shutil.rmtree(self._dir, ignore_errors=True)


class ActorEngine(SGLangRolloutEngine):
    """A cell actor's engine as the driver sees it: generation over HTTP, weights by the channel."""

    def __init__(self, url: str, engine_id: str, base_model_dir: Path, actor, channel: WeightsChannel) -> None:
        super().__init__(url, engine_id, base_model_dir=base_model_dir)
        self.actor = actor
        self.channel = channel

    def load_weights(self, snapshot: Path, version: int) -> None:
        if self.channel.kind == "disk":
            super().load_weights(snapshot, version)
            return
        import ray

        record = ray.get(self.actor.pull.remote(version), timeout=PULL_TIMEOUT_S + 30)
        self._version = record["version"]  # `version` or newer: what the server now reports
        self.channel.record(self.engine_id, record)


class ActorReader:
    """The actor's end: attached once (again after a restart), pulls into the cell's engine."""

    def __init__(self, kind: str, where: str | None) -> None:
        self.kind = kind
        self.reader = None
        if kind == "shm":
            from gyre.weights.shm import ShmTransport

            self.reader = ShmTransport.attach(where)
        elif kind == "mooncake":
            from gyre.weights.mooncake import MooncakeTransport

            self.reader = MooncakeTransport.attach(Path(where), host=_node_address())
        elif kind == "ray":
            from gyre.weights.ray_store import RayObjectTransport

            self.reader = RayObjectTransport.attach(where)

    def pull_into(self, engine, version: int) -> dict:
        """Pull `version` (or newer), load it into `engine`; the pull's record as a dict."""
        pulled = self.reader.pull(min_version=version, timeout_s=PULL_TIMEOUT_S)
        engine.load_snapshot(pulled.snapshot)
        record = asdict(pulled.record)
        record["started_at"] = pulled.record.started_at.isoformat()
        return record


def _node_address() -> str:
    """This process's Ray node address (127.0.0.1 for a local Ray on loopback, the host's own address
    in a cluster): where a Mooncake engine listens so the other hosts' engines reach it."""
    import ray

    return ray.util.get_node_ip_address()
