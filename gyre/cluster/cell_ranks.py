"""A cell of several ranks, seen by the driver as one engine and one training replica.

With `scheduler.ranks_per_cell: n` (and `scheduler.runtime: ray`) each cell beyond the core
is a group of n Ray actors in one placement group (`gyre.cluster.rollout_actor.RayCells`):
one actor per rank, a bundle each, packed on one host. A rank is a data-parallel replica
of the whole model: it serves its own engine over HTTP and, in the train role, trains its
own replica. (With `scheduler.cell_tensor_parallel` > 1 the ranks split the train engine
instead: `gyre.cluster.tp_cell.TensorParallelReplicas` replaces `CellReplicas` below; the
rollout side, `CellEngine`, is the same.)

The scheduler, the proxy's router and the drain, reroute and fault code keep seeing one
engine and one replica per cell, as with one rank:

- `CellEngine` is the cell's rollout engine. An execution's first call goes to the rank with
  the fewest calls in flight (ties: the one that served fewest), and its later calls to the
  same rank (the request's `affinity`, the execution's id, as the proxy's router keeps it on
  one cell), so its growing prompt finds its prefix cache there; a call with no affinity
  goes to the least busy rank. The result names the rank, so the recorded calls say which
  rank served them. Pause, resume, drain and weight loads (a publication's file or a pull from the
  weight channel) go to every rank at once; the cell reports the lowest version among its
  ranks, so a rank behind (one Ray restarted) makes the next load reach all of them.
- `CellReplicas` is the cell's training replica. A micro-step goes to the rank with the
  fewest in flight (ties: the one that trained fewest) and stays there: that rank holds its
  gradients. Loads of the core's weights and clears go to every rank. At the optimizer
  step every rank holding gradients is a member of its own in the reduction onto the core,
  keyed (cell, rank) (`gyre.runtime.live.training`). A rank dying fails the whole cell: what any of
  its ranks held is recomputed by the core.

The scheduler lets a cell of n ranks hold up to n micro-steps claimed at once
(`Topology.train_slots_per_cell`; the core holds one), so its ranks train side by side.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from gyre.cluster.remote_replica import RemoteReplica
from gyre.proxy.router import STICKY_CAPACITY
from gyre.engines.base import GenerationRequest, GenerationResult, RolloutEngine, TrainStats

T = TypeVar("T")


def rank_engine_id(engine_id: str, rank: int, ranks: int) -> str:
    """Rank `rank`'s engine id in a cell of `ranks` ranks whose engine is `engine_id` (one rank: the cell's)."""
    return engine_id if ranks == 1 else f"{engine_id}.rank{rank}"


def _each(items: list, fn: Callable[[object], T]) -> list[T]:
    """`fn` on every item at once (one thread each); every call ends before the first error is raised."""
    if len(items) == 1:
        return [fn(items[0])]
    with ThreadPoolExecutor(len(items)) as pool:
        futures = [pool.submit(fn, item) for item in items]
        return [f.result() for f in futures]


class _LeastBusy:
    """Picks the index with the fewest uses in flight, ties to the one used least, then the lowest."""

    def __init__(self, n: int) -> None:
        self._lock = threading.Lock()
        self.in_flight = [0] * n
        self.used = [0] * n
        self.peak = 0  # the most uses in flight at once, over all indices

    def take(self, prefer: int | None = None) -> int:
        """`prefer` when given, else the least busy index."""
        with self._lock:
            i = prefer if prefer is not None else min(range(len(self.used)),
                                                      key=lambda k: (self.in_flight[k], self.used[k], k))
            self.in_flight[i] += 1
            self.used[i] += 1
            self.peak = max(self.peak, sum(self.in_flight))
            return i

    def give_back(self, i: int) -> None:
        with self._lock:
            self.in_flight[i] -= 1


class CellEngine:
    """A cell's ranks' engines as one `RolloutEngine`."""

    def __init__(self, engine_id: str, ranks: list[RolloutEngine]) -> None:
        if not ranks:
            raise ValueError(f"cell engine {engine_id} needs at least one rank")
        self.engine_id = engine_id
        self.ranks = ranks
        self._pick = _LeastBusy(len(ranks))
        self._sticky: OrderedDict[str, int] = OrderedDict()  # affinity -> rank (the latest STICKY_CAPACITY)
        self._sticky_lock = threading.Lock()

    @property
    def served(self) -> list[int]:
        """Calls sent to each rank so far."""
        return list(self._pick.used)

    @property
    def policy_version(self) -> int:
        return min(r.policy_version for r in self.ranks)

    @property
    def max_context(self) -> int:
        return self.ranks[0].max_context

    @property
    def base_url(self) -> str:
        """Rank 0's address (`urls`: every rank's)."""
        return self.ranks[0].base_url

    @property
    def urls(self) -> list[str]:
        return [r.base_url for r in self.ranks]

    def generate(self, request: GenerationRequest) -> GenerationResult:
        key = request.affinity
        with self._sticky_lock:
            i = self._pick.take(self._sticky.get(key) if key is not None else None)
            if key is not None:
                self._sticky[key] = i
                self._sticky.move_to_end(key)
                if len(self._sticky) > STICKY_CAPACITY:
                    self._sticky.popitem(last=False)
        try:
            return self.ranks[i].generate(request)
        finally:
            self._pick.give_back(i)

    def load_weights(self, snapshot: Path, version: int) -> None:
        _each(self.ranks, lambda r: r.load_weights(snapshot, version))

    def pause(self) -> None:
        _each(self.ranks, lambda r: r.pause())

    def resume(self) -> None:
        _each(self.ranks, lambda r: r.resume())

    def drain(self, timeout_s: float | None = None) -> bool:
        return all(_each(self.ranks, lambda r: r.drain(timeout_s)))

    def close(self) -> None:
        for rank in self.ranks:
            rank.close()


class CellReplicas:
    """A cell's ranks' training replicas (`RemoteReplica`, one per rank actor) as one replica."""

    def __init__(self, cell_id: int, ranks: list[RemoteReplica]) -> None:
        self.cell_id = cell_id
        self.ranks = ranks
        self._pick = _LeastBusy(len(ranks))

    def load(self, ref, version: int) -> None:
        """The core's weights of `version` into every rank (raises `SatelliteDied` if one died)."""
        _each(self.ranks, lambda r: r.load(ref, version))

    @property
    def peak_in_flight(self) -> int:
        """The most micro-steps its ranks ran at once (the scheduler claims up to one per rank)."""
        return self._pick.peak

    def micro_step(self, micro_id: int, step: int, sequences: list) -> tuple[TrainStats | str, int]:
        """Forward-backward on the least busy rank: its stats (or why the loss was not finite)
        and the rank, which holds the gradients until the optimizer step."""
        i = self._pick.take()
        try:
            return self.ranks[i].micro_step(micro_id, step, sequences), i
        finally:
            self._pick.give_back(i)

    def clear(self) -> None:
        """Every rank forgets its gradients (raises `SatelliteDied` after clearing the living ones)."""
        _each(self.ranks, lambda r: r.clear())
