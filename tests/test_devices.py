"""Where the engines run: `rollout.device`, `train.device`, `scheduler.gpus_per_rank`.

On this CPU box: a device the process cannot use is a clear error naming the field before any
work, and a cell asking Ray for GPUs the cluster lacks is refused at once (a placement group
would wait forever). The `gpu` tests run the same live-cell path on CUDA where a GPU is
visible (skipped elsewhere, see conftest)."""

from __future__ import annotations

import pytest
import torch

from gyre.config.run import RunConfig
from gyre.engines.factory import EngineConfigError, rollout_engine, train_engine
from gyre.runtime.coordinator import Coordinator
from gyre.runtime.live.cells import LiveCells


def _config(tiny_model_dir, tmp_path, device: str = "cpu", **scheduler) -> RunConfig:
    return RunConfig.model_validate({
        "name": "devices", "steps": 2, "cache_dir": str(tmp_path / "cache"),
        "model": {"path": str(tiny_model_dir)},
        "benchmark": {"num_queries": 16},
        "rollout": {"queries_per_step": 1, "group_size": 4, "max_new_tokens": 16, "device": device},
        "harness": {"max_turns": 2},
        "train": {"lr": 3e-4, "device": device},
        "scheduler": scheduler,
    })  # fmt: skip


def test_devices_are_checked_by_the_config_and_by_the_process(tiny_model_dir, tmp_path):
    assert RunConfig().rollout.device == RunConfig().train.device == "cpu"
    assert RunConfig.model_validate({"train": {"device": "cuda:1"}}).train.device == "cuda:1"
    for bad in ("gpu", "cuda:x", "CUDA"):
        with pytest.raises(ValueError, match="rollout.device"):
            RunConfig.model_validate({"rollout": {"device": bad}})
    with pytest.raises(ValueError, match="gpus_per_rank: 1.0 needs scheduler.runtime: ray"):
        RunConfig.model_validate({"scheduler": {"gpus_per_rank": 1}})
    if torch.cuda.is_available():
        pytest.skip("this box has a GPU: the no-CUDA errors cannot happen here")
    config = _config(tiny_model_dir, tmp_path, "cuda")
    with pytest.raises(EngineConfigError, match=r"train.device: cuda, but torch sees no CUDA device"):
        train_engine(config, tiny_model_dir, seed=0)
    with pytest.raises(EngineConfigError, match=r"rollout.device: cuda, but torch sees no CUDA device"):
        rollout_engine(config, tiny_model_dir, 0, "e0", seed=0)
    with pytest.raises(EngineConfigError, match="rollout.device"):  # refused before anything is opened
        Coordinator(config, tmp_path / "run")
    assert not (tmp_path / "run" / "gyre.duckdb").exists()


@pytest.mark.slow
def test_a_cell_asking_for_gpus_the_ray_cluster_lacks_is_refused_at_once(tiny_model_dir):
    if torch.cuda.is_available():
        pytest.skip("this box has a GPU")
    from gyre.cluster.rollout_actor import RayCells

    cells = RayCells.start(None, num_cpus=2)
    try:
        with pytest.raises(ValueError, match=r"gpus_per_rank: 1 x 2 ranks needs 2 GPUs in one node, but the Ray "
                                             r"cluster has 0 in all"):
            cells.add(1, tiny_model_dir, "cell-1", seed=0, max_batch_size=4, prefix_cache_bytes=0, torch_threads=1,
                      ranks=2, gpus_per_rank=1, device="cuda")
        assert cells.cells == []
    finally:
        cells.close()


@pytest.mark.gpu
@pytest.mark.parametrize("runtime", ["threads", "ray"])
def test_live_cells_roll_out_and_train_on_cuda(tiny_model_dir, tmp_path, runtime):
    """2 cells, 2 steps with every engine on CUDA: the core's, and cell 1's. Threads: elastic, cell
    1 a slice of this process that rolls out and trains. Ray: cell 1 an actor holding half the
    GPU as its bundle, under async so it only rolls out: a satellite training beside the core
    on the one GPU would reduce over NCCL between two processes on one device, which NCCL
    refuses (a cluster gives each rank its own GPU)."""
    scheduler = {"policy": "elastic" if runtime == "threads" else "async", "num_cells": 2, "slots_per_cell": 4,
                 "executions_per_micro_step": 2, "runtime": runtime}
    if runtime == "ray":
        scheduler["gpus_per_rank"] = 0.5  # shares the one GPU with the core
    config = _config(tiny_model_dir, tmp_path, "cuda", **scheduler)
    coord = Coordinator(config, tmp_path / "run")
    try:
        assert coord.trainer.device.type == "cuda" and coord.rollout.device.type == "cuda"
        cells = LiveCells(coord, config.steps)
        records = cells.run()
        cells.close()
        assert [r.policy_version for r in records] == [1, 2]
        assert all(r.tokens_trained > 0 for r in records)
    finally:
        coord.close()
