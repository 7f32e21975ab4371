"""The rollout engines of real cells beyond the core: in this process, or each in a Ray actor.

Under `scheduler.runtime: threads` a cell's engine is built here by the engine factory (the
torch engine, or an SGLang server's adapter); under `ray` the run's Ray is started (or
joined) and each cell's engine is an actor of its own, reached over HTTP. Either way a cell
joining after version 0 loads the newest published snapshot first.
"""

from __future__ import annotations

from gyre.cells.topology import SchedulingConfigError
from gyre.config import RunConfig
from gyre.engines.base import RolloutEngine
from gyre.engines.factory import rollout_engine


def start_ray(config: RunConfig):
    """The run's Ray (`gyre.cluster.rollout_actor.RayCells`), for `scheduler.runtime: ray`."""
    from gyre.cluster.rollout_actor import RayCells

    if config.rollout.engine != "torch":
        raise SchedulingConfigError("scheduler.runtime: ray runs the torch engine in each cell's actor; with "
                                    "rollout.engine: sglang the servers are already separate (runtime: threads)")
    return RayCells.start(config.scheduler.ray_address, num_cpus=config.scheduler.num_cells)


def cell_engine(coord, ray, i: int) -> RolloutEngine:
    """Cell `i`'s rollout engine, serving the coordinator's current policy."""
    snapshot = coord.transport.latest() if coord.policy_version else None
    if ray is None:
        return rollout_engine(coord.config, coord.model_dir, i, f"cell-{i}", seed=coord.config.seed + i,
                              policy_version=coord.policy_version, snapshot=snapshot)
    rollout = coord.config.rollout
    engine = ray.add(i, coord.model_dir, f"cell-{i}", seed=coord.config.seed + i,
                     max_batch_size=rollout.max_batch_size, prefix_cache_bytes=rollout.prefix_cache_bytes,
                     torch_threads=coord.config.scheduler.ray_actor_threads)
    if snapshot is not None:
        engine.load_weights(snapshot, coord.policy_version)
    return engine


def describe(cell_id: int, engine: RolloutEngine) -> str:
    """What cell `cell_id` is: where its rollout engine lives and what trains on it."""
    where = getattr(engine, "base_url", None)
    serves = (f"its engine {engine.engine_id} at {where} (a process of its own)" if where
              else f"its engine {engine.engine_id} in this process")
    role = "core: owns the optimizer" if cell_id == 0 else "satellite: pulls the core's weights to train"
    return f"cell {cell_id}: {serves}; {role}"
