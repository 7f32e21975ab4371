"""The rollout engines of real cells beyond the core: in this process, or each in a Ray actor.

Under `scheduler.runtime: threads` a cell's engine is built here by the engine factory (the
torch engine, or an SGLang server's adapter); under `ray` the run's Ray is started (or
joined) and each cell is `scheduler.ranks_per_cell` actors, each rank's engine reached over
HTTP (several ranks: one engine to the router, `gyre.cluster.cell_ranks.CellEngine`). Either
way a cell joining after version 0 loads the newest published snapshot first.
"""

from __future__ import annotations

from gyre.engines.base import RolloutEngine
from gyre.engines.factory import rollout_engine


def start_ray(coord):
    """The run's Ray (`gyre.cluster.rollout_actor.RayCells`), for `scheduler.runtime: ray`, with its
    weight channel open on the current policy (actors attach to it when they start)."""
    from gyre.cluster.rollout_actor import RayCells

    sched = coord.config.scheduler
    if sched.cell_model_parallel > 1:  # a model the cells cannot split is refused before Ray starts
        from gyre.cluster.tp_cell import check_cell_model

        check_cell_model(coord.model_dir, sched.cell_tensor_parallel, sched.cell_pipeline_parallel)
    # a local Ray gets a CPU for every rank of the cells beyond the core, and one to spare
    ray = RayCells.start(sched.ray_address, num_cpus=(sched.num_cells - 1) * sched.ranks_per_cell + 1,
                         weight_transport=sched.weight_transport)
    try:
        ray.channel.open(policy_state(coord.trainer), coord.policy_version)
    except BaseException:
        ray.close()
        raise
    return ray


def policy_state(trainer) -> dict:
    """The trainer's weights under the rollout engines' (HF) names; a tied head under both names,
    as an HF model's state dict has it (the weight channels' snapshots are checked name by name)."""
    if not hasattr(trainer, "hf_state_dict"):
        return trainer.model.state_dict()
    state = trainer.hf_state_dict()
    if trainer.spec.tied_embeddings and "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def cell_engine(coord, ray, i: int) -> RolloutEngine:
    """Cell `i`'s rollout engine, serving the coordinator's current policy."""
    snapshot = coord.transport.latest() if coord.policy_version else None
    paced = coord.paced and coord.paced.engine_args  # rollout.engine: paced: the modelled cell it runs on
    if ray is None:
        return rollout_engine(coord.config, coord.model_dir, i, f"cell-{i}", seed=coord.config.seed + i,
                              policy_version=coord.policy_version, snapshot=snapshot, paced=paced)
    rollout = coord.config.rollout
    engine = ray.add(i, coord.model_dir, f"cell-{i}", seed=coord.config.seed + i,
                     max_batch_size=rollout.max_batch_size, prefix_cache_bytes=rollout.prefix_cache_bytes,
                     torch_threads=coord.config.scheduler.ray_actor_threads,
                     config=coord.config.model_dump(mode="json"), ranks=coord.config.scheduler.ranks_per_cell,
                     restart_whole=coord.config.scheduler.cell_model_parallel > 1,
                     gpus_per_rank=coord.config.scheduler.gpus_per_rank, device=rollout.device, paced=paced)
    if snapshot is not None:
        engine.load_weights(snapshot, coord.policy_version)
    return engine


def describe(cell_id: int, engine: RolloutEngine, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> str:
    """What cell `cell_id` is: where its rollout engine lives and what trains on it
    (`scheduler.cell_tensor_parallel`, `cell_pipeline_parallel`)."""
    where = getattr(engine, "base_url", None)
    urls = getattr(engine, "urls", None)
    serves = (f"its engine {engine.engine_id} over {len(urls)} ranks at {', '.join(urls)} (a process each)" if urls
              else f"its engine {engine.engine_id} at {where} (a process of its own)" if where
              else f"its engine {engine.engine_id} in this process")
    role = "core: owns the optimizer" if cell_id == 0 else "satellite: pulls the core's weights to train"
    if where and cell_id and urls and tensor_parallel * pipeline_parallel > 1:
        dp = len(urls) // (tensor_parallel * pipeline_parallel)
        role += (f" in the same processes, one Megatron world (tp {tensor_parallel}, pp {pipeline_parallel}, dp {dp}),"
                 " rank 0 reducing the cell's gradients onto the core over torch.distributed")
    elif where and cell_id:
        role += (" in the same processes, each rank a replica, reducing their gradients onto the core over "
                 "torch.distributed" if urls else
                 " in the same process, reducing its gradients onto the core over torch.distributed")
    return f"cell {cell_id}: {serves}; {role}"
