"""Shared-memory weight transport (gyre/weights/shm.py): bit-exact between processes, and
never a torn snapshot while the publisher keeps publishing."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import uuid

import numpy as np
import pytest

from gyre.weights.base import PullTimeoutError, TornReadError, WrongRoleError
from gyre.weights.shm import SHM_MAX_TORN_RETRIES, ShmTransport, slot_bytes_for
from gyre.weights.snapshot import ChecksumMismatchError, from_module, from_state_dict
from tests.weights_procs import (
    CHILD_WAIT_S,
    check_patterned,
    digests,
    patterned_state,
    shm_poller,
    shm_reader,
    tiny_qwen,
)

SPAWN = mp.get_context("spawn")


def _segment() -> str:
    return f"gyre-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _result(queue):
    status, value = queue.get(timeout=CHILD_WAIT_S + 5)
    assert status == "ok", value
    return value


def _join(proc) -> None:
    proc.join(timeout=10)
    if proc.is_alive():
        proc.kill()
        proc.join()


def test_qwen_snapshot_moves_bit_exactly_to_another_process():
    model = tiny_qwen(seed=0)
    snap = from_module(model, version=7)
    queue = SPAWN.Queue()
    with ShmTransport.create(_segment(), slot_capacity=slot_bytes_for(snap)) as pub:
        proc = SPAWN.Process(target=shm_reader, args=(pub.segment, 7, queue))
        proc.start()
        try:
            pub.publish(from_module(model, version=6))  # too old for the reader
            pub.publish(snap)
            version, checksum, got, record = _result(queue)
        finally:
            _join(proc)
    assert (version, checksum) == (7, snap.manifest.checksum)
    assert got == digests(model)
    assert record.transport == "shm" and record.version == 7 and record.nbytes == snap.nbytes
    assert record.seconds > 0 and record.started_at.tzinfo is not None
    assert not os.path.exists(f"/dev/shm/{pub.segment}")  # the publisher removed its segment


def test_a_reader_polling_during_publications_never_sees_a_torn_snapshot():
    last = 200
    snaps = [from_state_dict(patterned_state(v, numel=64 * 1024), v) for v in range(1, last + 1)]
    queue, ready = SPAWN.Queue(), SPAWN.Event()
    with ShmTransport.create(_segment(), slot_capacity=slot_bytes_for(snaps[-1])) as pub:
        proc = SPAWN.Process(target=shm_poller, args=(pub.segment, last, ready, queue))
        proc.start()
        try:
            assert ready.wait(CHILD_WAIT_S)
            for snap in snaps:  # in bursts: the reader is lapped now and then
                pub.publish(snap)
                if snap.version % 4 == 0:
                    time.sleep(0.004)
            seen, retries, lapped = _result(queue)
        finally:
            _join(proc)
    assert seen[-1] == last and seen == sorted(set(seen))
    print(f"versions pulled {len(seen)}/{last}, torn copies retried {retries}, pulls refused {lapped}")


def test_torn_copies_are_retried_corrupted_ones_refused(monkeypatch):
    snaps = [from_state_dict(patterned_state(v, numel=1024), v) for v in range(1, 40)]
    with ShmTransport.create(_segment(), slot_capacity=slot_bytes_for(snaps[-1])) as pub:
        reader = ShmTransport.attach(pub.segment)
        try:
            pub.publish(snaps[0])
            copy_slot = reader._copy_slot
            pending = iter(snaps[1:])

            def lapping_copy(slot):  # the publisher laps the reader mid-copy, once
                snap = copy_slot(slot)
                snap.buffer[100] ^= 0xFF  # what a tear looks like
                pub.publish(next(pending))
                pub.publish(next(pending))
                monkeypatch.setattr(reader, "_copy_slot", copy_slot)
                return snap

            monkeypatch.setattr(reader, "_copy_slot", lapping_copy)
            pulled = reader.pull()
            assert pulled.record.attempts == 2 and pulled.snapshot.version == 3
            assert check_patterned(pulled.snapshot.tensors(), 3)

            def always_lapped(slot):
                snap = copy_slot(slot)
                pub.publish(next(pending))
                pub.publish(next(pending))
                return snap

            monkeypatch.setattr(reader, "_copy_slot", always_lapped)
            with pytest.raises(TornReadError, match="outpaces"):
                reader.pull()
            assert SHM_MAX_TORN_RETRIES >= 1

            monkeypatch.setattr(reader, "_copy_slot", copy_slot)
            # corruption in place (the slot's seq does not move): refused, not retried
            victim = reader.pull().snapshot.manifest.entries[0]
            live = np.frombuffer(pub._owner.buf, dtype=np.uint8)
            start = pub._slot_start(int(pub._header[3]))  # the active slot
            manifest_len = int(live[start : start + 8].view(np.uint64)[0])
            live[start + 64 + -(-manifest_len // 64) * 64 + victim.offset] ^= 0x01
            del live
            with pytest.raises(ChecksumMismatchError, match=f"tensor '{victim.name}'"):
                reader.pull()
        finally:
            reader.close()


def test_roles_timeouts_and_capacity():
    snap = from_state_dict(patterned_state(1, numel=256), 1)
    with ShmTransport.create(_segment(), slot_capacity=slot_bytes_for(snap)) as pub:
        with ShmTransport.attach(pub.segment) as reader:
            with pytest.raises(PullTimeoutError, match=r"no snapshot >= v1 within 0.05 s \(newest: None\)"):
                reader.pull(min_version=1, timeout_s=0.05)
            with pytest.raises(WrongRoleError):
                reader.publish(snap)
            with pytest.raises(WrongRoleError):
                pub.pull()
            with pytest.raises(ValueError, match="slot_capacity >= slot_bytes_for"):
                pub.publish(from_state_dict(patterned_state(2, numel=4096), 2))
            pub.publish(snap)
            assert reader.latest_version() == 1
            with pytest.raises(PullTimeoutError, match=r"newest: 1"):
                reader.pull(min_version=2, timeout_s=0.05)
