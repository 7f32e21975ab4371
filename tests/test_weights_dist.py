"""torch.distributed weight transport (gyre/weights/dist.py): a gloo broadcast over
127.0.0.1 between two spawned ranks moves a Qwen3 snapshot bit-exactly; a buffer damaged in
transit is refused naming the tensor."""

from __future__ import annotations

import multiprocessing as mp

import torch

from gyre.weights.snapshot import from_module
from tests.weights_procs import CHILD_WAIT_S, digests, dist_rank, free_port, tiny_qwen

SPAWN = mp.get_context("spawn")


def test_broadcast_moves_a_qwen_snapshot_bit_exactly_and_refuses_a_damaged_one(tmp_path):
    model = tiny_qwen(seed=0)
    state_path = tmp_path / "state.pt"
    torch.save(model.state_dict(), state_path)
    port = free_port()
    queues = [SPAWN.Queue(), SPAWN.Queue()]
    procs = [SPAWN.Process(target=dist_rank, args=(rank, port, str(state_path), queues[rank])) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    try:
        results = [queue.get(timeout=CHILD_WAIT_S + 15) for queue in queues]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    for status, value in results:
        assert status == "ok", value
    damaged_tensor = results[0][1]
    version, checksum, got, refused, record = results[1][1]
    assert version == 3 and checksum == from_module(model, 3).manifest.checksum
    assert got == digests(model)
    assert f"snapshot v2: tensor '{damaged_tensor}'" in refused and "fails its checksum" in refused
    assert record.transport == "dist" and record.version == 3 and record.nbytes > 0 and record.seconds > 0
