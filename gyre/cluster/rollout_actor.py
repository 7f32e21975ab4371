"""Cells beyond the core as Ray actors: each its own process, rollout engine and training replica.

Under `scheduler.runtime: ray` the run starts one actor per cell beyond the core, once, for
the whole run. The actor builds the torch reference engine and serves it with SGLang's HTTP
API (`gyre.engines.torch_server`) on the node's address; the driver reaches it through the
same adapter it uses for a real SGLang server, so the proxy's router, drains, weight
publications and the cells' role switches work across processes exactly as in one. In the
train role the same process trains: its replica (`gyre.cluster.train_replica`) runs the
micro-steps it is sent and reduces its gradients onto the core over torch.distributed
(`gyre.cluster.grad_reduce`). Ray gives the process, its placement (one placement group per
cell, so a cell can later hold several ranks) and a restart when the process dies
(`max_restarts`).

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
from gyre.engines.sglang_adapter import SGLangRolloutEngine

ACTOR_START_TIMEOUT_S = 300.0  # building the engine in a fresh process on a loaded 2-core box
MAX_RESTARTS = 3  # Ray restarts a cell's process this often; after that the cell stays failed
WATCH_INTERVAL_S = 0.5  # how often the watcher asks each actor for its pid: a death is noticed within ~1 s
PING_TIMEOUT_S = 10.0  # an actor that does not answer within this is busy, not dead (a loaded box)


class RolloutCellActor:
    """The body of one cell's actor (wrapped with `ray.remote` by `RayCells`): its rollout
    engine behind an HTTP server, and its training replica (built when it first trains)."""

    def __init__(self, model_dir: str, engine_id: str, seed: int, max_batch_size: int, prefix_cache_bytes: int,
                 torch_threads: int, weights: tuple[str, str | None] = ("disk", None),
                 config: dict | None = None) -> None:
        import ray
        import torch

        from gyre.cluster.train_replica import ReplicaHost
        from gyre.engines.torch_rollout import TorchRolloutEngine
        from gyre.engines.torch_server import TorchEngineServer
        from gyre.proxy.server import ServerThread

        torch.set_num_threads(torch_threads)
        self.host = ray.util.get_node_ip_address()
        self.engine = TorchRolloutEngine(Path(model_dir), engine_id, max_batch_size=max_batch_size, seed=seed,
                                         prefix_cache_bytes=prefix_cache_bytes)
        self.server = TorchEngineServer(self.engine, Path(model_dir))
        self.thread = ServerThread(self.server.app, host=self.host, name=engine_id).start()
        self.reader = ActorReader(*weights)  # attached again by a restart: the constructor reruns
        self.replica = ReplicaHost(config, model_dir, seed) if config is not None else None

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

    def train_clear(self) -> None:
        self.replica.clear()

    def url(self) -> str:
        return f"http://{self.thread.host}:{self.thread.port}"

    def pid(self) -> int:
        return os.getpid()


@dataclass
class RayCell:
    cell_id: int
    actor: object
    engine: SGLangRolloutEngine
    pid: int
    model_dir: Path


@dataclass
class RayCells:
    """The run's Ray and its rollout-cell actors."""

    local: LocalRay | None
    cells: list[RayCell] = field(default_factory=list)
    _placement: list[object] = field(default_factory=list)
    _closing: threading.Event = field(default_factory=threading.Event)
    _watcher: threading.Thread | None = None
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
            prefix_cache_bytes: int, torch_threads: int, config: dict | None = None) -> SGLangRolloutEngine:
        """Start cell `cell_id`'s actor in its own placement group; its engine, once healthy.
        `config` (the run's, as a dict): the actor can train (a replica of `model_dir`)."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = placement_group([{"CPU": 1}], strategy="STRICT_PACK", name=f"gyre-cell-{cell_id}")
        ray.get(group.ready(), timeout=ACTOR_START_TIMEOUT_S)
        self._placement.append(group)
        actor_class = ray.remote(num_cpus=1, max_restarts=MAX_RESTARTS, max_task_retries=0)(RolloutCellActor)
        actor = actor_class.options(
            name=f"cell-{cell_id}-{os.getpid()}",
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group),
        ).remote(str(model_dir), engine_id, seed, max_batch_size, prefix_cache_bytes, torch_threads,
                 (self.channel.kind, self.channel.where), config)  # fmt: skip
        engine, pid = _connect(actor, engine_id, Path(model_dir), self.channel)
        self.cells.append(RayCell(cell_id, actor, engine, pid, Path(model_dir)))
        return engine

    def actor(self, cell_id: int):
        """Cell `cell_id`'s actor handle (the same across Ray's restarts of its process)."""
        return next(c.actor for c in self.cells if c.cell_id == cell_id)

    def watch(self, on_down: Callable[[int], None], on_back: Callable[[int, SGLangRolloutEngine], None]) -> None:
        """Notice a cell's process dying (`on_down(cell_id)`, within about a second) and coming
        back after Ray restarted it (`on_back(cell_id, engine)`: a new adapter on the new
        process's address, base weights loaded, not yet routed). One thread; callbacks run on it."""
        self._watcher = threading.Thread(target=self._watch, args=(on_down, on_back), name="ray-cells-watch",
                                         daemon=True)
        self._watcher.start()

    def _watch(self, on_down: Callable[[int], None], on_back: Callable[[int, SGLangRolloutEngine], None]) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        while not self._closing.wait(WATCH_INTERVAL_S):
            for cell in list(self.cells):
                try:
                    if ray.get(cell.actor.pid.remote(), timeout=PING_TIMEOUT_S) == cell.pid:
                        continue
                except GetTimeoutError:
                    continue  # busy, not dead
                except RayActorError:
                    pass  # died (restarting, or out of restarts)
                if self._closing.is_set():
                    return
                on_down(cell.cell_id)
                back = self._restarted(cell)
                if back is None:
                    return
                cell.engine, cell.pid = back
                on_back(cell.cell_id, cell.engine)

    def _restarted(self, cell: RayCell) -> tuple[SGLangRolloutEngine, int] | None:
        """The cell's engine once Ray has restarted its process; None when closing or out of restarts."""
        import ray
        from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

        deadline = time.monotonic() + ACTOR_START_TIMEOUT_S
        while not self._closing.is_set() and time.monotonic() < deadline:
            try:
                ray.get(cell.actor.pid.remote(), timeout=PING_TIMEOUT_S)
            except ActorDiedError:
                return None  # no restarts left: the cell stays failed
            except (RayActorError, GetTimeoutError):
                time.sleep(WATCH_INTERVAL_S)
                continue
            return _connect(cell.actor, cell.engine.engine_id, cell.model_dir, self.channel)
        return None

    def close(self) -> None:
        import ray

        self._closing.set()
        if self._watcher is not None:
            self._watcher.join(timeout=PING_TIMEOUT_S + 1)
        for cell in self.cells:
            cell.engine.close()
            ray.kill(cell.actor, no_restart=True)
        for group in self._placement:
            ray.util.remove_placement_group(group)
        self.channel.close()  # before Ray goes: the `ray` transport's board is an actor
        ray.shutdown()
        if self.local is not None:
            self.local.stop()


def _connect(actor, engine_id: str, model_dir: Path, channel: WeightsChannel) -> tuple[ActorEngine, int]:
    """The driver's engine for the actor once its server answers, and the actor's pid."""
    import ray

    url = ray.get(actor.url.remote(), timeout=ACTOR_START_TIMEOUT_S)
    pid = ray.get(actor.pid.remote(), timeout=ACTOR_START_TIMEOUT_S)
    engine = ActorEngine(url, engine_id, model_dir, actor, channel)
    engine.wait_healthy(ACTOR_START_TIMEOUT_S)
    return engine, pid
