"""The driver's handle on the training replicas in the cells' actors, and the step's reduction.

`gyre.runtime.live.training` trains cell 0 (the core) in the driver and every other cell through a
`RemoteReplica` per rank: the core's weights go to the actor through Ray's object store (put once
per version, fetched by each satellite that pulls it), each micro-step's packed rows go
with the call, and the stats come back. At the optimizer step `reduce_onto_core` sums the
satellites' gradients onto the core with torch.distributed in a group of exactly the
satellites' ranks that hold gradients for the step (`gyre.cluster.grad_reduce`), each rank a
member of its own (`gyre.cluster.cell_ranks`).

A satellite whose process dies takes its gradients with it. The reduction then fails (or a
restarted actor reports it holds nothing); the driver waits for the fault watcher to name
the dead, tries again without them, and returns, per satellite, the micro-steps whose
gradients did reach the core. The caller recomputes the rest on the core.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from gyre.cluster import grad_reduce
from gyre.engines.base import TrainStats

MAX_REDUCE_ATTEMPTS = 3  # a reduction that fails is tried again without the members found dead
ACTOR_CALL_TIMEOUT_S = 600.0  # one micro-step or weight load on a loaded box
ROLL_POLL_S = 0.02  # how often the core looks at the roll call


class SatelliteDied(RuntimeError):
    """The satellite's process died during the call; its work is lost (the watcher reports it)."""


@dataclass
class RemoteReplica:
    cell_id: int
    actor: object
    rank: int = 0  # the rank in its cell (`scheduler.ranks_per_cell`)

    def load(self, ref, version: int) -> None:
        self._get(self.actor.train_load.remote(ref, version))

    def micro_step(self, micro_id: int, step: int, sequences: list) -> TrainStats | str:
        return self._get(self.actor.train_micro_step.remote(micro_id, step, sequences))

    def clear(self) -> None:
        self._get(self.actor.train_clear.remote())

    # a rank of a tensor-parallel cell (`gyre.cluster.tp_cell`)

    def join_world(self, host: str, port: int, prefix: str, size: int) -> None:
        self._get(self.actor.train_world.remote(host, port, prefix, self.rank, size))

    def prepare(self, kind: str, names: list[str]) -> list[int]:
        return self._get(self.actor.train_prepare.remote(kind, names))

    def _get(self, ref):
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(ref, timeout=ACTOR_CALL_TIMEOUT_S)
        except RayActorError as exc:
            raise SatelliteDied(f"cell {self.cell_id}'s process (rank {self.rank}) died: {exc}") from exc


class WeightsByObjectStore:
    """The core's weights in Ray's object store, one object per version (the newest kept)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version: int | None = None
        self._ref = None

    def ref(self, version: int, state: Callable[[], dict]):
        import ray

        with self._lock:
            if self._version != version:
                self._ref, self._version = ray.put({k: v.detach().clone() for k, v in state().items()}), version
            return self._ref


def reduce_onto_core(
    store: grad_reduce.GradStore,
    core_params: list,
    step: int,
    members: dict[Hashable, RemoteReplica],
    expected: dict[Hashable, list[int]],
    dead: Callable[[set], set],
) -> dict[Hashable, list[int]]:
    """Sum `members`' gradients for `step` onto `core_params`; per member, the micro-steps whose
    gradients arrived (a subset of `expected[member]`). A member is keyed by anything sortable
    (the live run: (cell, rank)); each gets its own rank in the group, in key order.
    `dead(members)`: which of them the fault watcher has seen die (it may wait a little)."""
    alive = dict(members)
    for _ in range(MAX_REDUCE_ATTEMPTS):
        if not alive:
            return {}
        prefix = store.next_prefix(step)
        ranks = {cid: rank for rank, cid in enumerate(sorted(alive), start=1)}
        refs = {cid: alive[cid].actor.train_reduce.remote(store.host, store.port, prefix, ranks[cid], len(ranks) + 1)
                for cid in ranks}  # fmt: skip
        out = _attempt(store, prefix, core_params, ranks, refs, dead)
        if isinstance(out, set):  # these members declined or died: again without them
            alive = {cid: r for cid, r in alive.items() if cid not in out}
            continue
        return {cid: [m for m in expected.get(cid, []) if m in set(ids)] for cid, ids in out.items()}
    raise RuntimeError(f"the gradient reduction of step {step} failed {MAX_REDUCE_ATTEMPTS} times")


def _attempt(store, prefix: str, core_params: list, ranks: dict[Hashable, int], refs: dict,
             dead: Callable[[set], set]) -> dict[Hashable, list[int]] | set:
    """One attempt: the roll call, then the collective. What each member sent, or the members
    to leave out of the next attempt."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline = time.monotonic() + grad_reduce.REDUCE_TIMEOUT_S
    by_rank = {rank: cid for cid, rank in ranks.items()}
    while True:
        answers = store.answers(prefix, list(by_rank))
        failed = _failed(refs)
        if len(answers) == len(by_rank) or failed or time.monotonic() > deadline:
            break
        time.sleep(ROLL_POLL_S)
    go = not failed and len(answers) == len(by_rank) and set(answers.values()) == {"ready"}
    store.decide(prefix, go)
    if not go:
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=grad_reduce.REDUCE_TIMEOUT_S)
        out = {by_rank[r] for r, a in answers.items() if a == "declined"} | set(_failed(refs))
        return out or dead(set(ranks)) or _stuck(set(ranks) - {by_rank[r] for r in answers})
    group = None
    try:
        group = grad_reduce.join(store.store, prefix, 0, len(ranks) + 1, store.host, core_params[0].device)
        sums = grad_reduce.receive_sum(group, core_params)
        sent = {cid: ray.get(ref, timeout=grad_reduce.REDUCE_TIMEOUT_S) for cid, ref in refs.items()}
    except (RuntimeError, RayActorError, GetTimeoutError):  # deliberate: a member died in the collective
        group = None  # closes the core's sockets: members still in the collective fail too
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=grad_reduce.REDUCE_TIMEOUT_S)
        gone = dead(set(ranks))
        if not gone:
            raise
        return gone
    grad_reduce.add_sum(sums)  # only now: a failed attempt left the core's gradients as they were
    return sent


def _failed(refs: dict) -> list:
    """Members whose reduce call has already ended because their process died (any other error
    in a member, a bug, is raised here)."""
    import ray
    from ray.exceptions import RayActorError

    done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0)
    failed = []
    for cid, ref in refs.items():
        if ref in done:
            try:
                ray.get(ref, timeout=0)
            except RayActorError:  # deliberate: a dead member is left out, its micro-steps recomputed
                failed.append(cid)
    return failed


def _stuck(cells: set) -> set:
    if not cells:
        raise RuntimeError("a gradient reduction was aborted with every member ready and none failed")
    return cells  # never answered within the timeout: left out, their micro-steps recomputed
