"""Weight transport through Ray's object store (gyre/weights/ray_store.py): a snapshot published
by the driver reaches an actor's process bit-exactly; a reader waits for the version it asks
for, sees only whole versions, and refuses a corrupted buffer."""

from __future__ import annotations

import pytest

from gyre.cluster.ray_local import loopback_environment, start_local_ray
from gyre.weights.base import PullTimeoutError, WrongRoleError
from gyre.weights.snapshot import ChecksumMismatchError, from_module, from_state_dict
from tests.weights_procs import check_patterned, digests, patterned_state, tiny_qwen


class Reader:
    """An actor in its own process: attaches to the board and pulls."""

    def __init__(self, board: str) -> None:
        from gyre.weights.ray_store import RayObjectTransport

        self.transport = RayObjectTransport.attach(board)

    def pull_digests(self, min_version: int, timeout_s: float) -> tuple[int, dict, int]:
        import os

        pulled = self.transport.pull(min_version, timeout_s)
        return pulled.record.version, digests(pulled.snapshot.tensors()), os.getpid()

    def pull_patterned(self, min_version: int) -> tuple[int, bool]:
        pulled = self.transport.pull(min_version, 30.0)
        return pulled.snapshot.version, check_patterned(pulled.snapshot.tensors(), pulled.snapshot.version)


@pytest.fixture(scope="module")
def ray_session():
    loopback_environment()
    local = start_local_ray(num_cpus=2)
    import ray

    ray.init(address=local.address, log_to_driver=False, namespace="gyre")
    try:
        yield ray
    finally:
        ray.shutdown()
        local.stop()


@pytest.mark.slow
def test_a_snapshot_reaches_an_actor_bit_exactly_and_readers_wait_for_their_version(ray_session):
    import os

    from gyre.weights.ray_store import RayObjectTransport

    ray = ray_session
    publisher = RayObjectTransport.create("test-board-exact")
    try:
        reader = ray.remote(num_cpus=1)(Reader).remote("test-board-exact")
        model = tiny_qwen(seed=5)
        waiting = reader.pull_digests.remote(3, 30.0)  # asked before anything is published
        publisher.publish(from_module(tiny_qwen(seed=6), version=2))  # older than asked: not taken
        publisher.publish(from_module(model, version=3))
        version, got, pid = ray.get(waiting, timeout=60)
        assert version == 3 and got == digests(model) and pid != os.getpid()
        for v in range(4, 9):  # later versions: each pull gets one whole version, never a mix
            publisher.publish(from_state_dict(patterned_state(v, 50_000), version=v))
            assert ray.get(reader.pull_patterned.remote(v), timeout=60) == (v, True)
        # a buffer damaged after publication (put on the board by hand) is refused, never loaded
        snapshot = from_state_dict(patterned_state(9, 1000), version=9)
        bad = snapshot.buffer.clone()
        bad[10] ^= 0xFF
        ray.get(publisher.board.put.remote(9, [ray.put((snapshot.manifest.to_json(), bad))]))
        with pytest.raises(ChecksumMismatchError):
            ray.get(reader.pull_digests.remote(9, 30.0), timeout=60)
        with pytest.raises(PullTimeoutError, match="no snapshot >= v99"):
            ray.get(reader.pull_digests.remote(99, 0.5), timeout=60)
        with pytest.raises(WrongRoleError):
            publisher.pull(0)
    finally:
        publisher.close()

