"""Tensor-parallel cells (`scheduler.cell_tensor_parallel`): a Ray cell's ranks split the Megatron
train engine as one world; its rank 0 alone sends the cell's gradients, in the core's layout,
in the reduction onto the core; a rank dying restarts the whole cell and its world is formed
again. Real Ray actors, real Megatron-core on CPU (gloo); all but the config test skipped
without the `megatron` extra."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from gyre.algo.gspo import GSPO
from gyre.cells import events as ev
from gyre.config.run import RunConfig
from gyre.engines.torch.train import TorchTrainEngine
from tests.test_cells_ray import _config as ray_config

TOL = 1e-4  # fp32: the same micro-step's gradients, split over two ranks or not
KILL_WAIT_S = 300.0  # the cell holding gradients; Ray restarting both its ranks (a loaded box)


def _run_config(model_dir, tmp_path, tensor_parallel: int, steps: int = 2, pipeline_parallel: int = 1,
                **scheduler) -> RunConfig:
    """test_cells_ray's small run (2 queries x 4), Megatron training, cells split tp x pp."""
    base = ray_config(model_dir, tmp_path, "tp-cell", steps=steps, max_new_tokens=24, **scheduler)
    data = base.model_dump(mode="json")
    data["scheduler"]["cell_tensor_parallel"] = tensor_parallel
    data["scheduler"]["cell_pipeline_parallel"] = pipeline_parallel
    return RunConfig.model_validate({**data, "train": {"engine": "megatron", "lr": 1e-4}})


def test_tensor_parallel_cells_need_ray_megatron_a_one_process_core_and_whole_groups(tmp_path):
    ok = {"runtime": "ray", "ranks_per_cell": 4, "cell_tensor_parallel": 2}
    config = RunConfig.model_validate({"scheduler": ok, "train": {"engine": "megatron"}})
    assert config.scheduler.cell_tensor_parallel == 2 and RunConfig().scheduler.cell_tensor_parallel == 1
    stages = {"runtime": "ray", "ranks_per_cell": 4, "cell_tensor_parallel": 2, "cell_pipeline_parallel": 2}
    assert RunConfig.model_validate({"scheduler": stages, "train": {"engine": "megatron"}}).scheduler.cell_model_parallel == 4
    bad = [
        ({"scheduler": {"cell_tensor_parallel": 2}}, "cell_tensor_parallel: 2 needs scheduler.runtime: ray"),
        ({"scheduler": {"cell_pipeline_parallel": 2}}, "cell_pipeline_parallel: 2 needs scheduler.runtime: ray"),
        ({"scheduler": {**ok, "ranks_per_cell": 3}},
         "cell_tensor_parallel x cell_pipeline_parallel = 2 x 1 must divide scheduler.ranks_per_cell: 3"),
        ({"scheduler": {**ok, "cell_pipeline_parallel": 2, "ranks_per_cell": 2}},
         "cell_tensor_parallel x cell_pipeline_parallel = 2 x 2 must divide scheduler.ranks_per_cell: 2"),
        ({"scheduler": ok}, "cell_tensor_parallel: 2, cell_pipeline_parallel: 1 split the train engine with "
         "Megatron: it needs train.engine: megatron"),
        ({"scheduler": ok, "train": {"engine": "megatron", "megatron": {"tp": 2}}},
         "needs train.megatron.tp: 1 and pp: 1"),
        ({"scheduler": {"runtime": "ray"}, "train": {"engine": "megatron"}}, "model-parallel cells"),
        ({"scheduler": {**ok, "cell_tensor_parallel": 0}}, "cell_tensor_parallel"),
    ]
    for data, message in bad:
        with pytest.raises(ValueError, match=message.replace(".", r"\.")):
            RunConfig.model_validate(data)


def test_a_model_the_cell_cannot_split_is_refused_before_ray_starts(tiny_model_dir):
    pytest.importorskip("megatron.core")
    from gyre.cluster.tp_cell import check_cell_model
    from gyre.engines.megatron.convert import UnsupportedModelError

    check_cell_model(tiny_model_dir, 2)
    check_cell_model(tiny_model_dir, 2, 2)
    with pytest.raises(UnsupportedModelError, match="not divisible by pipeline parallel size 3"):
        check_cell_model(tiny_model_dir, 1, 3)  # two layers
    with pytest.raises(UnsupportedModelError, match="not divisible by tensor parallel size 3"):
        check_cell_model(tiny_model_dir, 3)


def _layout(actor) -> tuple[int, int, int, int, int, int, int | None]:
    """In a rank's actor: its engine's tp, pp, dp, tp rank, pipeline stage, decoder layers and
    embedding rows (None: a later stage, which has no embedding)."""
    from megatron.core import parallel_state as ps

    engine = actor.replica.engine
    embedding = getattr(engine.model, "embedding", None)
    rows = embedding.word_embeddings.weight.shape[0] if embedding is not None else None
    return (engine.parallel.tp, engine.parallel.pp, engine.dp_size, engine.tp_rank,
            ps.get_pipeline_model_parallel_rank(), len(engine.model.decoder.layers), rows)


@pytest.mark.slow
@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)])
def test_a_model_parallel_cell_adds_to_the_core_the_reference_gradients_of_its_micro_step(
        tiny_model_dir, tmp_path, tp, pp):
    """Through the real path: two rank actors in one placement group form the cell's world (two
    tensor-parallel shards, or two pipeline stages), each loads its part of the core's weights,
    both run the micro-step, rank 0 alone is the member of the reduction onto the core; a torch
    core and a Megatron core (tp 1) each end up with the gradients they would have computed
    themselves."""
    pytest.importorskip("megatron.core")
    from gyre.cluster.grad_reduce import GradStore
    from gyre.cluster.remote_replica import RemoteReplica, reduce_onto_core
    from gyre.cluster.rollout_actor import RayCells
    from gyre.cluster.tp_cell import TensorParallelReplicas, core_layout
    from gyre.engines.megatron.train import MegatronTrainEngine
    from tests.test_megatron_train import _batch  # three plain rows and a tree-packed one

    config = _run_config(tiny_model_dir, tmp_path, tp, pipeline_parallel=pp, ranks_per_cell=2)
    batch = _batch(tiny_model_dir)
    reference = TorchTrainEngine(tiny_model_dir, lr=1e-4, tree_attention="mask")
    ref_stats = reference.forward_backward(batch, GSPO().loss)
    ref_grads = {n: p.grad.clone() for n, p in reference.model.named_parameters()}
    cells = RayCells.start(None, num_cpus=3)
    megatron_core = None
    try:
        import ray  # after RayCells set Ray's loopback environment

        cells.add(1, tiny_model_dir, "cell-1", seed=0, max_batch_size=4, prefix_cache_bytes=0, torch_threads=1,
                  config=config.model_dump(mode="json"), ranks=2, restart_whole=True)
        store = GradStore()
        cell = TensorParallelReplicas(1, [RemoteReplica(1, a, r) for r, a in enumerate(cells.actors(1))], lambda: store)
        torch_core = TorchTrainEngine(tiny_model_dir, lr=1e-4, tree_attention="mask")
        megatron_core = MegatronTrainEngine(tiny_model_dir, lr=1e-4)
        for step, core in enumerate([torch_core, megatron_core]):
            cell.load(ray.put(core.model.state_dict() if step == 0 else core.hf_state_dict()), step)  # HF tensors
            stats, rank = cell.micro_step(10 + step, step, batch)
            assert rank == 0 and abs(stats.loss - ref_stats.loss) < TOL
            assert stats.tokens_trained == ref_stats.tokens_trained  # every row trained once, not once per rank
            cell.prepare(core_layout(core))
            arrived = reduce_onto_core(store, list(core.model.parameters()), step, {(1, 0): cell.ranks[0]},
                                       {(1, 0): [10 + step]}, lambda members: set())
            assert arrived == {(1, 0): [10 + step]}
            got = ({n: p.grad for n, p in core.model.named_parameters()} if step == 0 else core.hf_gradients())
            diff = max(float((got[n] - g).abs().max()) for n, g in ref_grads.items())
            print(f"{type(core).__name__} core: max |grad diff| against the reference {diff:.3g}")
            assert diff < TOL
            cell.clear()
        assert cell.worlds == 1
        # split, not two replicas: tp 2, each rank half the embedding rows; pp 2, each rank half the
        # layers and only the first stage the embedding
        shapes = ray.get([a.__ray_call__.remote(_layout) for a in cells.actors(1)], timeout=60)
        vocab = reference.model.get_input_embeddings().weight.shape[0]
        layers = reference.model.config.num_hidden_layers
        expected = ([(2, 1, 1, 0, 0, layers, vocab // 2), (2, 1, 1, 1, 0, layers, vocab // 2)] if tp == 2 else
                    [(1, 2, 1, 0, 0, layers // 2, vocab), (1, 2, 1, 0, 1, layers // 2, None)])
        assert shapes == expected, shapes
        assert max(float(g.abs().max()) for g in ref_grads.values()) > 1e-3  # not trivially zero
    finally:
        if megatron_core is not None:
            megatron_core.close()
        cells.close()


@pytest.mark.slow
def test_a_tp2_cell_trains_in_a_run_and_is_rebuilt_whole_after_a_rank_is_killed(tiny_model_dir, tmp_path):
    """Colocate, the core (Megatron, tp 1) and one cell of two ranks at tp 2, 4 steps: the cell
    trains one micro-step at a time on both ranks; rank 1 killed as soon as the cell holds
    gradients fails the cell, the core recomputes them, Ray restarts both ranks (the survivor
    killed by the watcher), and the cell trains again in a new world, its rank 0 the only member
    of the reductions. Every micro-step applied once. So that the rejoin does not race the
    run's end on a loaded box (two restarts take ~25 s), the first publication after the kill
    waits in `on_published` until Ray has restarted both ranks."""
    pytest.importorskip("megatron.core")
    from gyre.runtime.coordinator import Coordinator
    from gyre.runtime.live.cells import LiveCells

    config = _run_config(tiny_model_dir, tmp_path, 2, steps=4, ranks_per_cell=2, policy="colocate",
                         num_cells=2, slots_per_cell=8, lookahead_groups=0, executions_per_micro_step=1,
                         weight_transport="shm")
    coord = Coordinator(config, tmp_path / "run")
    stop = threading.Event()
    killed: list[int] = []  # the version being trained when rank 1 was killed
    live: list[LiveCells] = []

    def hold_until_restarted(version: int) -> None:
        deadline = time.monotonic() + KILL_WAIT_S
        while killed and time.monotonic() < deadline:
            if all(r.pid not in pids for r in live[0].ray.cells[0].ranks):  # the watcher reconnected both
                return
            time.sleep(0.1)

    try:
        live.append(LiveCells(coord, config.steps, on_published=hold_until_restarted))
        cells = live[0]
        import ray

        pids = [rank.pid for rank in cells.ray.cells[0].ranks]
        training = cells.training

        def kill_rank_1_holding_gradients():
            deadline = time.monotonic() + KILL_WAIT_S
            while time.monotonic() < deadline and not stop.is_set():
                held = [d for books in list(training.books.values()) for d in list(books.done.values())]
                if any(d.cell_id == 1 for d in held):
                    killed.append(len(training.reductions))
                    os.kill(pids[1], signal.SIGKILL)
                    return
                time.sleep(0.005)

        threading.Thread(target=kill_rank_1_holding_gradients, daemon=True).start()
        records = cells.run()
        claims = cells.log.of(ev.ClaimMicroStep)
        faults = [(r.cell_id, r.what) for r in cells.faults.records]
        after = [ray.get(a.pid.remote(), timeout=300) for a in cells.ray.actors(1)]
        cells.close()
    finally:
        stop.set()
        coord.close()
    assert killed, f"cell 1 never held gradients: {training.reductions}"
    assert [r.policy_version for r in records] == [1, 2, 3, 4]
    assert all(r.tokens_trained > 0 and r.grad_norm is not None for r in records)
    # the killed rank failed the cell; both ranks were restarted (the survivor too), and it trained again
    assert (1, "failed") in faults and (1, "rejoined") in faults, (faults, training.reductions)
    assert after[0] != pids[0] and after[1] != pids[1]
    assert training.remote[1].worlds == 2
    again = [r for r in training.reductions[killed[0] + 1:] if r.members == [(1, 0)]]
    assert again and all(r.micro_steps >= 1 and r.nbytes > 0 for r in again), training.reductions
    # rank 0 alone was ever a member for the cell
    assert all(r.members in ([], [(1, 0)]) for r in training.reductions), training.reductions
    # every micro-step of every step applied exactly once: 8 per step, what the cell held recomputed
    by_step: dict[int, set[int]] = {}
    for claim in claims:
        by_step.setdefault(claim.step_index, set()).add(claim.micro_step_id)
    assert {s: sorted(ids) for s, ids in training.applied.items()} == {s: sorted(ids) for s, ids in by_step.items()}
    assert all(len(ids) == 8 for ids in by_step.values())
    lost = [(step, micro) for step, micro, cell_id in training.recomputed if cell_id == 1]
    assert lost and all(training.applied[step][micro] == 0 for step, micro in lost), training.recomputed
