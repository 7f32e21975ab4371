"""Weight transport through Ray's object store: one object per version, found through a board actor.

When the cells already run on Ray, its object store is a transport that needs nothing else:
the publisher `ray.put`s each snapshot (manifest and buffer) once, and every reader fetches it
from the store of its own node (Ray copies it between nodes, shared memory within one). A
small named actor, the board, holds the newest version's reference, so a reader asks it for
"version >= v" without the publisher naming each reader; holding the reference also keeps the
object alive until a newer one replaces it.

Why a reader never sees half a snapshot: objects in Ray's store are immutable and a `get`
returns the whole object or raises; the checksum is verified after the fetch regardless.
"""

from __future__ import annotations

import threading

from gyre.weights.base import DEFAULT_PULL_TIMEOUT_S, PullClock, Pulled, PullTimeoutError, WrongRoleError
from gyre.weights.snapshot import Manifest, Snapshot

POLL_INTERVAL_S = 0.05  # a reader waiting for a newer version asks the board this often


class WeightsBoard:
    """The board actor's body: the newest (version, [object ref]) published."""

    def __init__(self) -> None:
        self.version = -1
        self.ref: list = []

    def put(self, version: int, ref: list) -> None:
        if version > self.version:
            self.version, self.ref = version, ref

    def latest(self, min_version: int) -> tuple[int, list]:
        """(version, [ref]) when a version >= `min_version` is published, else (version, [])."""
        return (self.version, self.ref) if self.version >= min_version else (self.version, [])


class RayObjectTransport:
    name = "ray"

    def __init__(self, board, publisher: bool, board_name: str) -> None:
        self.board = board
        self.publisher = publisher
        self.board_name = board_name
        self._lock = threading.Lock()

    @classmethod
    def create(cls, board_name: str) -> "RayObjectTransport":
        """The publisher's end: starts the named board actor (in the `gyre` namespace, no CPU)."""
        import ray

        board = ray.remote(num_cpus=0)(WeightsBoard).options(name=board_name, namespace="gyre").remote()
        return cls(board, True, board_name)

    @classmethod
    def attach(cls, board_name: str) -> "RayObjectTransport":
        import ray

        return cls(ray.get_actor(board_name, namespace="gyre"), False, board_name)

    def publish(self, snapshot: Snapshot) -> None:
        import ray

        if not self.publisher:
            raise WrongRoleError(f"ray object store {self.board_name!r}: a reader cannot publish")
        with self._lock:
            ref = ray.put((snapshot.manifest.to_json(), snapshot.buffer))
            ray.get(self.board.put.remote(snapshot.version, [ref]))

    def pull(self, min_version: int = 0, timeout_s: float = DEFAULT_PULL_TIMEOUT_S) -> Pulled:
        import ray

        if self.publisher:
            raise WrongRoleError(f"ray object store {self.board_name!r}: the publisher cannot pull")
        clock = PullClock()
        while True:
            version, ref = ray.get(self.board.latest.remote(min_version), timeout=timeout_s)
            if ref:
                break
            if clock.elapsed() > timeout_s:
                raise PullTimeoutError(f"ray object store {self.board_name!r}: no snapshot >= v{min_version} "
                                       f"within {timeout_s:g} s (newest: v{version})")
            clock.wait(POLL_INTERVAL_S)
        manifest, buffer = ray.get(ref[0], timeout=timeout_s)
        snapshot = Snapshot(Manifest.from_json(manifest), buffer.clone())  # the store's copy is read-only
        snapshot.verify()
        return clock.record(self.name, snapshot)

    def close(self) -> None:
        import ray

        if self.publisher:
            ray.kill(self.board)
