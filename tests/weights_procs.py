"""Helpers for the weight-transport tests (tests/test_weights_*.py): a real small model, and
the bodies of the processes they spawn (importable by name, as the "spawn" context needs).

Every process here talks only over 127.0.0.1 and gives up after a bounded wait.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import traceback

import torch

CHILD_WAIT_S = 25.0  # how long any spawned helper waits for its peer before giving up


def tiny_qwen(seed: int) -> torch.nn.Module:
    """A real Qwen3 causal LM, hidden size 64, tied embeddings, float32."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config)


def digests(module_or_state) -> dict[str, str]:
    """sha256 of each tensor's bytes, by name: equal digests mean bit-identical weights."""
    state = module_or_state.state_dict() if isinstance(module_or_state, torch.nn.Module) else module_or_state
    return {
        name: hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        + f":{t.dtype}:{tuple(t.shape)}"
        for name, t in state.items()
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def patterned_state(version: int, numel: int) -> dict[str, torch.Tensor]:
    """A state dict whose every element is derived from `version` (so a reader can tell a
    snapshot mixing two versions from a whole one without trusting the checksum)."""
    return {
        "a": torch.full((numel,), float(version), dtype=torch.float32),
        "b": torch.full((numel // 2,), version, dtype=torch.int64),
        "c": torch.full((7,), float(version), dtype=torch.bfloat16),
    }


def check_patterned(tensors: dict[str, torch.Tensor], version: int) -> bool:
    return all(bool((t == version).all()) for t in tensors.values())


def _report(queue, fn, *args) -> None:
    try:
        queue.put(("ok", fn(*args)))
    except BaseException:
        queue.put(("error", traceback.format_exc()))


# -- shared memory ---------------------------------------------------------------------


def shm_reader(segment: str, min_version: int, queue) -> None:
    def body():
        from gyre.weights.shm import ShmTransport

        with ShmTransport.attach(segment) as reader:
            pulled = reader.pull(min_version=min_version, timeout_s=CHILD_WAIT_S)
        return pulled.snapshot.version, pulled.snapshot.manifest.checksum, digests(pulled.snapshot.tensors()), pulled.record

    _report(queue, body)


def shm_poller(segment: str, last_version: int, ready, queue) -> None:
    """Pull as fast as possible until `last_version` is seen; every snapshot is checked
    against its version's pattern. Returns versions seen, torn retries, refused pulls."""

    def body():
        from gyre.weights.base import TornReadError
        from gyre.weights.shm import ShmTransport

        seen: list[int] = []
        retries = lapped = 0
        reader = ShmTransport.attach(segment)
        ready.set()
        deadline = time.monotonic() + CHILD_WAIT_S
        try:
            while (not seen or seen[-1] < last_version) and time.monotonic() < deadline:
                try:
                    pulled = reader.pull(min_version=seen[-1] + 1 if seen else 1, timeout_s=CHILD_WAIT_S)
                except TornReadError:
                    lapped += 1  # refused, never returned: allowed
                    continue
                v = pulled.snapshot.version
                if not check_patterned(pulled.snapshot.tensors(), v):
                    raise AssertionError(f"torn snapshot returned: v{v} does not hold v{v}'s pattern")
                seen.append(v)
                retries += pulled.record.attempts - 1
        finally:
            reader.close()
        return seen, retries, lapped

    _report(queue, body)


# -- torch.distributed -----------------------------------------------------------------


def dist_rank(rank: int, port: int, state_path: str, queue) -> None:
    """Rank 0 publishes v1, v2 (one bit flipped in transit), v3 of the state dict saved at
    `state_path`; rank 1 pulls min_version=2 (must be refused), then min_version=3."""

    def body():
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        import torch.distributed as dist

        from gyre.weights.dist import DistTransport, init_group
        from gyre.weights.snapshot import ChecksumMismatchError, Snapshot, from_state_dict

        init_group(rank, 2, port, timeout_s=CHILD_WAIT_S)
        try:
            transport = DistTransport(src=0)
            if rank == 0:
                state = torch.load(state_path)
                transport.publish(from_state_dict(state, 1))
                good = from_state_dict(state, 2)
                bad = good.buffer.clone()
                bad[good.manifest.entries[3].offset] ^= 0x10
                transport.publish(Snapshot(good.manifest, bad))
                transport.publish(from_state_dict(state, 3))
                return good.manifest.entries[3].name
            try:
                transport.pull(min_version=2)
                refused = ""
            except ChecksumMismatchError as err:
                refused = str(err)
            pulled = transport.pull(min_version=3)
            snap = pulled.snapshot
            return snap.version, snap.manifest.checksum, digests(snap.tensors()), refused, pulled.record
        finally:
            dist.destroy_process_group()

    _report(queue, body)


# -- Mooncake --------------------------------------------------------------------------


def mooncake_publisher(descriptor: str, state_path: str, go, queue) -> None:
    """Publish v1 of the state dict at `state_path`; after `go`, v2 with one bit flipped;
    hold the buffer until `go` is set a second time (cleared in between)."""

    def body():
        from gyre.weights.mooncake import MooncakeTransport
        from gyre.weights.snapshot import Snapshot, from_state_dict

        state = torch.load(state_path)
        first = from_state_dict(state, 1)
        with MooncakeTransport.create(descriptor, slot_capacity=first.nbytes) as pub:
            pub.publish(first)
            if not go.wait(CHILD_WAIT_S):
                raise TimeoutError("the reader never pulled v1")
            go.clear()
            second = from_state_dict(state, 2)
            bad = second.buffer.clone()
            bad[second.manifest.entries[5].offset + 1] ^= 0x01
            pub.publish(Snapshot(second.manifest, bad))
            if not go.wait(CHILD_WAIT_S):
                raise TimeoutError("the reader never pulled v2")
        return second.manifest.entries[5].name

    _report(queue, body)


def mooncake_reader(descriptor: str, go, queue) -> None:
    def body():
        from gyre.weights.mooncake import MooncakeTransport
        from gyre.weights.snapshot import ChecksumMismatchError

        reader = MooncakeTransport.attach(descriptor)
        try:
            pulled = reader.pull(min_version=1, timeout_s=CHILD_WAIT_S)
            go.set()
            try:
                reader.pull(min_version=2, timeout_s=CHILD_WAIT_S)
                refused = ""
            except ChecksumMismatchError as err:
                refused = str(err)
        finally:
            go.set()
            reader.close()
        snap = pulled.snapshot
        return snap.version, snap.manifest.checksum, digests(snap.tensors()), refused, pulled.record

    _report(queue, body)
