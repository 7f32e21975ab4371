"""Rollout cells as Ray actors: each its own process, its engine served over HTTP.

Under `scheduler.runtime: ray` the run starts one actor per cell beyond the core, once, for
the whole run. The actor builds the torch reference engine and serves it with SGLang's HTTP
API (`gyre.engines.torch_server`) on the node's address; the driver reaches it through the
same adapter it uses for a real SGLang server, so the proxy's router, drains, weight
publications and the cells' role switches work across processes exactly as in one. Ray
gives the process, its placement (one placement group per cell, so a cell can later hold
several ranks) and a restart when the process dies (`max_restarts`).

`RayCells` owns the run's Ray: a local head on loopback (`gyre.cluster.ray_local`), or an
existing cluster at `scheduler.ray_address`; its `close` kills the actors and stops the head.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from gyre.cluster.ray_local import LocalRay, loopback_environment, start_local_ray
from gyre.engines.sglang_adapter import SGLangRolloutEngine

ACTOR_START_TIMEOUT_S = 300.0  # building the engine in a fresh process on a loaded 2-core box
MAX_RESTARTS = 3  # Ray restarts a cell's process this often before the run stops on it


class RolloutCellActor:
    """The body of one rollout cell's actor (wrapped with `ray.remote` by `RayCells`)."""

    def __init__(self, model_dir: str, engine_id: str, seed: int, max_batch_size: int, prefix_cache_bytes: int,
                 torch_threads: int) -> None:
        import ray
        import torch

        from gyre.engines.torch_rollout import TorchRolloutEngine
        from gyre.engines.torch_server import TorchEngineServer
        from gyre.proxy.server import ServerThread

        torch.set_num_threads(torch_threads)
        self.engine = TorchRolloutEngine(Path(model_dir), engine_id, max_batch_size=max_batch_size, seed=seed,
                                         prefix_cache_bytes=prefix_cache_bytes)
        self.server = TorchEngineServer(self.engine, Path(model_dir))
        self.thread = ServerThread(self.server.app, host=ray.util.get_node_ip_address(), name=engine_id).start()

    def url(self) -> str:
        return f"http://{self.thread.host}:{self.thread.port}"

    def pid(self) -> int:
        return os.getpid()


@dataclass
class RayCell:
    cell_id: int
    actor: object
    engine: SGLangRolloutEngine


@dataclass
class RayCells:
    """The run's Ray and its rollout-cell actors."""

    local: LocalRay | None
    cells: list[RayCell] = field(default_factory=list)
    _placement: list[object] = field(default_factory=list)

    @classmethod
    def start(cls, address: str | None, num_cpus: int) -> "RayCells":
        loopback_environment()
        local = start_local_ray(num_cpus) if address is None else None
        import ray

        ray.init(address=local.address if local else address, log_to_driver=False, namespace="gyre")
        return cls(local)

    def add(self, cell_id: int, model_dir: Path, engine_id: str, *, seed: int, max_batch_size: int,
            prefix_cache_bytes: int, torch_threads: int) -> SGLangRolloutEngine:
        """Start cell `cell_id`'s actor in its own placement group; its engine, once healthy."""
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
        ).remote(str(model_dir), engine_id, seed, max_batch_size, prefix_cache_bytes, torch_threads)  # fmt: skip
        url = ray.get(actor.url.remote(), timeout=ACTOR_START_TIMEOUT_S)
        engine = SGLangRolloutEngine(url, engine_id, base_model_dir=Path(model_dir))
        engine.wait_healthy(ACTOR_START_TIMEOUT_S)
        self.cells.append(RayCell(cell_id, actor, engine))
        return engine

    def close(self) -> None:
        import ray

        for cell in self.cells:
            cell.engine.close()
            ray.kill(cell.actor, no_restart=True)
        for group in self._placement:
            ray.util.remove_placement_group(group)
        ray.shutdown()
        if self.local is not None:
            self.local.stop()
