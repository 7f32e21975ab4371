"""Cells beyond the core as Ray actors: each rank its own process, rollout engine and training replica.

Under `scheduler.runtime: ray` the run starts, once for the whole run, the actors of every
cell beyond the core: `scheduler.ranks_per_cell` of them per cell (one by default), each
with a bundle of its own in the cell's one placement group (STRICT_PACK: a cell's ranks
share a host). Each actor builds the torch reference engine and serves it with SGLang's
HTTP API (`gyre.engines.torch.server`) on the node's address; the driver reaches it through
the same adapter it uses for a real SGLang server, and a cell of several ranks through a
`CellEngine` over theirs (`gyre.cluster.cell_ranks`), so the proxy's router, drains, weight
publications and the cells' role switches work across processes exactly as in one. In the
train role the same processes train: each rank's replica (`gyre.cluster.train_replica`)
runs the micro-steps it is sent and reduces its gradients onto the core over
torch.distributed (`gyre.cluster.grad_reduce`). A rank is a data-parallel replica, or,
with `scheduler.cell_tensor_parallel` > 1, a rank of the cell's Megatron world
(`gyre.cluster.tp_cell`: training only; every rank still serves its own rollout engine). Ray
gives the processes, their placement and a restart when one dies (`max_restarts`); any rank
dying fails its whole cell until every rank is back. A tensor-parallel cell cannot take back
one restarted rank, so when one dies the watcher kills the others too (Ray restarts them) and
the cell comes back once every rank answers from a new process (`restart_whole`).

`RayCells` owns the run's Ray: a local head on loopback (`gyre.cluster.ray_local`), or an
existing cluster at `scheduler.ray_address`; its `close` kills the actors and stops the head.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gyre.cluster.ray_local import LocalRay, loopback_environment, start_local_ray
from gyre.cluster.actor_weights import ActorEngine, ActorReader, WeightsChannel
from gyre.cluster.cell_ranks import CellEngine, rank_engine_id
from gyre.cluster.cell_watch import WATCH_INTERVAL_S, CellWatch
from gyre.engines.sglang.adapter import SGLangRolloutEngine

ACTOR_START_TIMEOUT_S = 300.0  # building the engine in a fresh process on a loaded 2-core box
MAX_RESTARTS = 3  # Ray restarts a cell's process this often; after that the cell stays failed
PING_TIMEOUT_S = 10.0  # an actor that does not answer within this is busy, not dead (a loaded box)
RANK_SEED_STRIDE = 100_003  # rank r of a cell is seeded with the cell's seed + r * this: its ranks sample differently


class RolloutCellActor:
    """The body of one rank's actor (wrapped with `ray.remote` by `RayCells`): its rollout
    engine behind an HTTP server, and its training replica (built when it first trains)."""

    def __init__(self, model_dir: str, engine_id: str, seed: int, max_batch_size: int, prefix_cache_bytes: int,
                 torch_threads: int, weights: tuple[str, str | None] = ("disk", None),
                 config: dict | None = None, device: str = "cpu", paced: tuple | None = None) -> None:
        import ray
        import torch

        from gyre.cluster.tp_cell import replica_host
        from gyre.engines.factory import check_device, paced_engine
        from gyre.engines.torch.rollout import TorchRolloutEngine
        from gyre.engines.torch.server import TorchEngineServer
        from gyre.net.server_thread import ServerThread

        torch.set_num_threads(torch_threads)
        self.host = ray.util.get_node_ip_address()
        self.engine = TorchRolloutEngine(Path(model_dir), engine_id, max_batch_size=max_batch_size, seed=seed,
                                         prefix_cache_bytes=prefix_cache_bytes,
                                         device=check_device(device, "rollout.device"))  # its bundle's GPU
        if paced is not None:  # rollout.engine: paced: released on the modelled cell's clock
            self.engine = paced_engine(self.engine, paced)
        self.server = TorchEngineServer(self.engine, Path(model_dir))
        self.thread = ServerThread(self.server.app, host=self.host, name=engine_id).start()
        self.reader = ActorReader(*weights)  # attached again by a restart: the constructor reruns
        self.replica = replica_host(config, model_dir, seed)  # a whole replica, or a tensor-parallel rank

    def pull(self, version: int) -> dict:
        """Pull policy `version` (or newer) through the run's weight channel into the engine."""
        return self.reader.pull_into(self.engine, version)

    # the train role: each call is the replica's (`gyre.cluster.train_replica.ReplicaHost`)

    def train_load(self, state: dict, version: int) -> None:
        self.replica.load(state, version)

    def train_micro_step(self, micro_id: int, step: int, sequences: list):
        return self.replica.micro_step(micro_id, step, sequences)

    def train_reduce(self, host: str, port: int, prefix: str, rank: int, size: int) -> list[int]:
        return self.replica.reduce(host, port, prefix, rank, size, self.host)

    def train_world(self, host: str, port: int, prefix: str, rank: int, size: int) -> None:
        self.replica.join_world(host, port, prefix, rank, size)

    def train_prepare(self, kind: str, names: list[str]) -> list[int]:
        return self.replica.prepare(kind, names)

    def train_clear(self) -> None:
        if self.replica is not None:
            self.replica.clear()

    def warm(self) -> None:
        """A paced engine's warm-up (`PacedRolloutEngine.warm`); nothing for another engine."""
        if hasattr(self.engine, "warm"):
            self.engine.warm()

    def paced_stats(self) -> dict | None:
        """A paced engine's counts (calls, late calls, ...) and its cell's peak of calls at once; None
        for an engine that is not paced."""
        from dataclasses import asdict

        stats = getattr(self.engine, "stats", None)
        if stats is None:
            return None
        return {**asdict(stats), "peak_active": self.engine.device_clock.peak_active}

    def url(self) -> str:
        return f"http://{self.thread.host}:{self.thread.port}"

    def pid(self) -> int:
        return os.getpid()


@dataclass
class RayRank:
    """One rank of a cell: its actor (the handle survives Ray's restarts), its engine and its pid."""

    actor: object
    engine: ActorEngine
    pid: int


@dataclass
class RayCell:
    cell_id: int
    ranks: list[RayRank]
    engine: SGLangRolloutEngine | CellEngine  # one rank: its engine; more: a `CellEngine` over theirs
    model_dir: Path
    restart_whole: bool = False  # one rank dying restarts them all (a tensor-parallel cell's world)

    @property
    def actor(self):
        """Rank 0's actor."""
        return self.ranks[0].actor


@dataclass
class RayCells:
    """The run's Ray and its cells' rank actors."""

    local: LocalRay | None
    cells: list[RayCell] = field(default_factory=list)
    _placement: list[object] = field(default_factory=list)
    _closing: threading.Event = field(default_factory=threading.Event)
    _watcher: threading.Thread | None = None
    watcher: CellWatch | None = None
    channel: WeightsChannel = field(default_factory=lambda: WeightsChannel("disk"))

    @classmethod
    def start(cls, address: str | None, num_cpus: int, weight_transport: str = "disk") -> "RayCells":
        channel = WeightsChannel(weight_transport)  # a bad name fails before Ray starts
        if address is None:  # a cluster's driver speaks over the network, not loopback
            loopback_environment()
        local = start_local_ray(num_cpus) if address is None else None
        import ray

        ray.init(address=local.address if local else address, log_to_driver=False, namespace="gyre")
        return cls(local, channel=channel)

    def add(self, cell_id: int, model_dir: Path, engine_id: str, *, seed: int, max_batch_size: int,
            prefix_cache_bytes: int, torch_threads: int, config: dict | None = None,
            ranks: int = 1, restart_whole: bool = False, gpus_per_rank: float = 0.0,
            device: str = "cpu", paced: tuple | None = None) -> SGLangRolloutEngine | CellEngine:
        """Start cell `cell_id`'s `ranks` actors in one placement group (a bundle of one CPU each,
        STRICT_PACK: on one host); its engine once every rank is healthy. `config` (the run's, as
        a dict): the actors can train (each a replica of `model_dir`, or a tensor-parallel rank).
        `restart_whole`: when one rank dies the watcher kills the others so Ray restarts them all
        (a tensor-parallel world cannot take back one restarted member). `gpus_per_rank`: GPUs in
        each rank's bundle and actor (refused at once when the cluster has too few); `device`: the
        rank's rollout engine's torch device; `paced`: the modelled cell (device model, pacing) each
        rank's engine is released on (`rollout.engine: paced`)."""
        import ray
        from ray.exceptions import GetTimeoutError
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": 1, "GPU": gpus_per_rank} if gpus_per_rank else {"CPU": 1}
        if gpus_per_rank:  # a placement group asking for GPUs the cluster lacks would wait forever
            have = ray.cluster_resources().get("GPU", 0)
            if have < gpus_per_rank * ranks:
                raise ValueError(f"cell {cell_id}: scheduler.gpus_per_rank: {gpus_per_rank} x {ranks} ranks needs "
                                 f"{gpus_per_rank * ranks:g} GPUs in one node, but the Ray cluster has {have:g} in all")
        group = placement_group([bundle] * ranks, strategy="STRICT_PACK", name=f"gyre-cell-{cell_id}")
        try:
            ray.get(group.ready(), timeout=ACTOR_START_TIMEOUT_S)
        except GetTimeoutError:
            raise TimeoutError(f"cell {cell_id}: Ray placed no {ranks} bundles of {bundle} on one node (STRICT_PACK) "
                               f"within {ACTOR_START_TIMEOUT_S:.0f} s; the cluster has {ray.cluster_resources()}") from None
        self._placement.append(group)
        actor_class = ray.remote(num_cpus=1, num_gpus=gpus_per_rank, max_restarts=MAX_RESTARTS,
                                 max_task_retries=0)(RolloutCellActor)
        actors = [actor_class.options(
            name=f"{rank_engine_id(f'cell-{cell_id}', rank, ranks)}-{os.getpid()}",  # cell-1-<pid>, cell-1.rank0-<pid>
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group,
                                                                 placement_group_bundle_index=rank),
        ).remote(str(model_dir), rank_engine_id(engine_id, rank, ranks), seed + RANK_SEED_STRIDE * rank,
                 max_batch_size, prefix_cache_bytes, torch_threads, (self.channel.kind, self.channel.where), config,
                 device, paced)
            for rank in range(ranks)]  # fmt: skip  (all start at once, then each is waited for)
        cell = RayCell(cell_id, [], None, Path(model_dir), restart_whole)
        cell.ranks = [RayRank(actor, *_connect(actor, rank_engine_id(engine_id, rank, ranks), cell.model_dir,
                                               self.channel)) for rank, actor in enumerate(actors)]  # fmt: skip
        cell.engine = _cell_engine(engine_id, cell.ranks)
        self.cells.append(cell)
        return cell.engine

    def actor(self, cell_id: int):
        """Cell `cell_id`'s rank 0 actor handle (the same across Ray's restarts of its process)."""
        return self.actors(cell_id)[0]

    def actors(self, cell_id: int) -> list:
        """Cell `cell_id`'s actor handles, by rank."""
        return [r.actor for r in next(c for c in self.cells if c.cell_id == cell_id).ranks]

    def placement(self, cell_id: int):
        """Cell `cell_id`'s placement group."""
        return self._placement[next(i for i, c in enumerate(self.cells) if c.cell_id == cell_id)]

    def watch(self, on_down: Callable[[int], None], on_back: Callable[[int, object], None],
              on_lost: Callable[[int, str], None] = lambda cell_id, why: None) -> None:
        """Notice any rank's process of a cell dying (`on_down(cell_id)`, within about a second),
        the cell coming back once Ray restarted every dead rank (`on_back(cell_id, engine)`: a new
        engine on the ranks' addresses, every rank healthy, the restarted ones on base weights, not
        yet routed), and a cell that will not come back (`on_lost(cell_id, why)`: out of restarts,
        or not back within ACTOR_START_TIMEOUT_S). Every cell is watched on its own
        (`gyre.cluster.cell_watch`): a cell restarting or lost never hides another's death. One
        thread; callbacks run on it."""
        self.watcher = CellWatch(lambda: list(self.cells), on_down=on_down, on_back=on_back, on_lost=on_lost,
                                 reconnect=self._reconnect, kill_survivors=_kill_survivors, closing=self._closing,
                                 restart_timeout_s=ACTOR_START_TIMEOUT_S)
        self._watcher = threading.Thread(target=self.watcher.run, name="ray-cells-watch", daemon=True)
        self._watcher.start()

    def _reconnect(self, cell: RayCell) -> SGLangRolloutEngine | CellEngine:
        """Cell `cell` once Ray restarted its dead ranks: connect to every rank again (`cell.ranks`,
        `cell.engine`, each waited healthy) and return its new engine."""
        cell.ranks = [RayRank(r.actor, *_connect(r.actor, r.engine.engine_id, cell.model_dir, self.channel))
                      for r in cell.ranks]  # fmt: skip
        cell.engine = _cell_engine(cell.engine.engine_id, cell.ranks)
        return cell.engine

    def close(self) -> None:
        import ray

        self._closing.set()
        if self._watcher is not None:
            self._watcher.join(timeout=PING_TIMEOUT_S + 1)
        for cell in self.cells:
            cell.engine.close()
            for rank in cell.ranks:
                ray.kill(rank.actor, no_restart=True)
        for group in self._placement:
            ray.util.remove_placement_group(group)
        self.channel.close()  # before Ray goes: the `ray` transport's board is an actor
        ray.shutdown()
        if self.local is not None:
            self.local.stop()


def _cell_engine(engine_id: str, ranks: list[RayRank]) -> SGLangRolloutEngine | CellEngine:
    """The driver's engine for a cell: its one rank's, or one spreading calls over its ranks."""
    return ranks[0].engine if len(ranks) == 1 else CellEngine(engine_id, [r.engine for r in ranks])


def _kill_survivors(cell: RayCell) -> None:
    """Kill (Ray restarts them) the ranks of `cell` still in the process they had: those answering
    with their old pid, and those too busy to answer (stuck in a collective with the dead)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    asks = [(rank, rank.actor.pid.remote()) for rank in cell.ranks]
    for rank, ref in asks:
        try:
            if ray.get(ref, timeout=PING_TIMEOUT_S) != rank.pid:
                continue  # already a new process
        except RayActorError:
            continue  # the dead one (restarting, or out of restarts)
        except GetTimeoutError:
            pass  # deliberate: busy in a collective with the dead one, killed too
        ray.kill(rank.actor, no_restart=False)
        _wait_gone(rank)


def _wait_gone(rank: RayRank) -> None:
    """Until the killed rank's old process is seen gone (a call fails, or a new pid answers): a
    call sent earlier would fail as if the actor were out of restarts (`gyre.cluster.cell_watch`)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline = time.monotonic() + ACTOR_START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if ray.get(rank.actor.pid.remote(), timeout=PING_TIMEOUT_S) != rank.pid:
                return
        except RayActorError:
            return
        except GetTimeoutError:
            continue
        time.sleep(WATCH_INTERVAL_S / 5)


def _connect(actor, engine_id: str, model_dir: Path, channel: WeightsChannel) -> tuple[ActorEngine, int]:
    """The driver's engine for the actor once its server answers, and the actor's pid."""
    import ray

    url = ray.get(actor.url.remote(), timeout=ACTOR_START_TIMEOUT_S)
    pid = ray.get(actor.pid.remote(), timeout=ACTOR_START_TIMEOUT_S)
    engine = ActorEngine(url, engine_id, model_dir, actor, channel)
    engine.wait_healthy(ACTOR_START_TIMEOUT_S)
    return engine, pid
