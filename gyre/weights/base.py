"""The weight-transport interface: a publisher hands out snapshots, readers pull them.

The train engine's core cell publishes each new policy version as a `Snapshot`
(`snapshot.py`); rollout engines and satellite cells pull the newest one at or above the
version they need. Backends differ only in how the bytes move (shared memory on one host,
a torch.distributed broadcast, a Mooncake RDMA/TCP read), so they share one small protocol
and one record per pull, which the run can append to DuckDB to compare them.

What every backend guarantees: a pull never returns half a snapshot. Each backend says how
in its docstring (a seqlock over two slots, a collective that completes or raises, a read
of a slot that stays published until two newer versions exist), and, whatever the
mechanism, `pull` verifies the snapshot's checksum before returning it.

`gyre.engines.file_transport.FileSnapshotTransport` (safetensors written then renamed) stays the
reference the run uses until these are wired in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol, runtime_checkable

from gyre.weights.snapshot import Snapshot

DEFAULT_PULL_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.002  # how often a reader waiting for a newer version looks again


class PullTimeoutError(TimeoutError):
    """No snapshot at or above the requested version was published in time."""


class TornReadError(RuntimeError):
    """The publisher kept overwriting the slot a reader was copying, past the retry bound."""


class WrongRoleError(RuntimeError):
    """`publish` called on a reader, or `pull` on a publisher."""


@dataclass(frozen=True)
class PullRecord:
    """One pull, as the run stores it (one row per pull)."""

    transport: str  # "shm", "dist", "mooncake", ...
    version: int
    nbytes: int
    seconds: float  # from the start of the pull to a verified snapshot in hand
    started_at: datetime  # UTC
    attempts: int = 1  # 1 + torn reads retried
    wait_seconds: float = 0.0  # part of `seconds` spent waiting for a new enough version

    @property
    def bytes_per_s(self) -> float:
        moving = self.seconds - self.wait_seconds
        return self.nbytes / moving if moving > 0 else float("inf")


@dataclass(frozen=True)
class Pulled:
    snapshot: Snapshot
    record: PullRecord


@runtime_checkable
class WeightTransport(Protocol):
    """One end of a transport: a publisher (`publish`) or a reader (`pull`)."""

    name: str

    def publish(self, snapshot: Snapshot) -> None:
        """Make `snapshot` the newest version readers can pull (publisher side)."""
        ...

    def pull(self, min_version: int = 0, timeout_s: float = DEFAULT_PULL_TIMEOUT_S) -> Pulled:
        """The newest snapshot with version >= `min_version`, checksum verified (reader side).
        Waits for it up to `timeout_s` (`PullTimeoutError`)."""
        ...

    def close(self) -> None: ...


class PullClock:
    """Times one pull: `started_at`, `seconds`, waiting time, attempts."""

    def __init__(self) -> None:
        self.started_at = datetime.now(timezone.utc)
        self._t0 = time.perf_counter()
        self.wait_seconds = 0.0
        self.attempts = 1

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)
        self.wait_seconds += seconds

    def record(self, transport: str, snapshot: Snapshot) -> Pulled:
        rec = PullRecord(
            transport=transport,
            version=snapshot.version,
            nbytes=snapshot.nbytes,
            seconds=self.elapsed(),
            started_at=self.started_at,
            attempts=self.attempts,
            wait_seconds=self.wait_seconds,
        )
        return Pulled(snapshot, rec)
