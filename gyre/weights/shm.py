"""Weight transport on one host through POSIX shared memory.

Cells on one box (the CPU reference, or several engines on one GPU node) should not pay a
file write and a file read per policy version: the publisher copies the snapshot once into
a shared-memory segment, each reader copies it once out of it.

Layout of the segment: a header page of u64 fields, then two slots. A slot holds the
manifest's length, the manifest (JSON) and the flat buffer. The publisher always writes the
slot readers are not pointed at, then flips `active` to it, so a publication never blocks
and never waits on readers.

Why a reader never returns a torn snapshot (a seqlock per slot, then the checksum):

- before writing slot i the publisher makes `seq[i]` odd, after writing it even again;
- a reader takes `active` and `seq[active]` (even, else the slot is being rewritten), copies
  the slot, and reads `seq[active]` again; any change means the publisher lapped it (two
  publications during one copy) and the copy is thrown away and retried, at most
  `SHM_MAX_TORN_RETRIES` times (`TornReadError` after that: the publisher outpaces it);
- the copy's checksum is verified (`Snapshot.verify`); a mismatch with an unchanged `seq`
  is corruption, raised as `ChecksumMismatchError`, never retried.

The header fields are aligned 8-byte words written with single stores, so on x86-64 the
seqlock alone suffices; on weaker memory orders the checksum is what still refuses a tear.

Readers map the segment read-only and bypass `multiprocessing.resource_tracker` (Python
3.11 would otherwise unlink the publisher's segment when a reader process exits); the
publisher's segment is tracked, so it is removed even if the publisher dies.
"""

from __future__ import annotations

import mmap
import os
import warnings
from multiprocessing import shared_memory

import _posixshmem
import numpy as np
import torch

from gyre.weights.base import (
    DEFAULT_PULL_TIMEOUT_S,
    POLL_INTERVAL_S,
    PullClock,
    Pulled,
    PullTimeoutError,
    TornReadError,
    WrongRoleError,
)
from gyre.weights.snapshot import ChecksumMismatchError, Manifest, Snapshot, SnapshotError

SHM_MAX_TORN_RETRIES = 16  # copies a reader throws away because the publisher lapped it
MAGIC = 0x6779726557534D31  # "gyreWSM1"
LAYOUT = 1
HEADER_BYTES = 4096
SLOT_ALIGN = 64
NONE_ACTIVE = 2  # `active` before the first publication

# header word indices
_MAGIC, _LAYOUT, _CAPACITY, _ACTIVE, _GENERATION = 0, 1, 2, 3, 4
_SEQ = (5, 6)
_VERSION = (7, 8)
_HEADER_WORDS = 9


class _Lapped(Exception):
    """The publisher rewrote the slot while it was being copied."""


def _align(n: int) -> int:
    return -(-n // SLOT_ALIGN) * SLOT_ALIGN


def _as_tensor(view: np.ndarray) -> torch.Tensor:
    """A torch view of part of the mapping, so copies run on torch's threads: numpy's single-threaded copy
    pulled 1.1 GB/s where torch's copy ran at 19.7 GB/s on a 16-core GPU host (scripts/README.md, gpu_check (f)).
    The reader's mapping is read-only, which torch warns about; it is only ever read through this view."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(view)


def slot_bytes_for(snapshot: Snapshot) -> int:
    """Bytes a slot needs to hold `snapshot`."""
    return SLOT_ALIGN + _align(len(snapshot.manifest.to_json())) + snapshot.nbytes


class ShmTransport:
    """One end of a shared-memory transport: `create` (publisher) or `attach` (reader)."""

    name = "shm"

    def __init__(self, segment: str, mapping: mmap.mmap | memoryview, publisher: bool, owner=None) -> None:
        self.segment = segment
        self.publisher = publisher
        self._owner = owner  # the publisher's SharedMemory
        self._map = mapping
        self._bytes = np.frombuffer(mapping, dtype=np.uint8)
        self._header = np.frombuffer(mapping, dtype=np.uint64, count=_HEADER_WORDS)
        if int(self._header[_MAGIC]) != MAGIC or int(self._header[_LAYOUT]) != LAYOUT:
            raise SnapshotError(f"shared memory {segment!r} is not a gyre weight segment (layout {LAYOUT})")
        self.slot_capacity = int(self._header[_CAPACITY])

    # -- ends -------------------------------------------------------------------------

    @classmethod
    def create(cls, segment: str, slot_capacity: int) -> ShmTransport:
        """A new segment with two slots of `slot_capacity` bytes (see `slot_bytes_for`)."""
        size = HEADER_BYTES + 2 * _align(slot_capacity)
        shm = shared_memory.SharedMemory(name=segment, create=True, size=size)
        try:
            os.posix_fallocate(shm._fd, 0, size)  # ENOSPC now, not SIGBUS on the first write
        except OSError as err:
            shm.close()
            shm.unlink()
            raise OSError(
                err.errno, f"shared memory {segment!r}: cannot reserve {size} bytes in /dev/shm ({err.strerror}); "
                "a container needs a larger --shm-size"
            ) from err
        header = np.frombuffer(shm.buf, dtype=np.uint64, count=_HEADER_WORDS)
        header[:] = 0
        header[_CAPACITY] = _align(slot_capacity)
        header[_ACTIVE] = NONE_ACTIVE
        header[_LAYOUT] = LAYOUT
        header[_MAGIC] = MAGIC
        del header
        return cls(segment, shm.buf, publisher=True, owner=shm)

    @classmethod
    def attach(cls, segment: str) -> ShmTransport:
        """A read-only view of a publisher's segment."""
        fd = _posixshmem.shm_open("/" + segment, os.O_RDONLY, mode=0)
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        return cls(segment, mapping, publisher=False)

    # -- publisher --------------------------------------------------------------------

    def _slot_start(self, slot: int) -> int:
        return HEADER_BYTES + slot * self.slot_capacity

    def publish(self, snapshot: Snapshot) -> None:
        if not self.publisher:
            raise WrongRoleError(f"shared memory {self.segment!r}: a reader cannot publish")
        manifest = snapshot.manifest.to_json()
        need = SLOT_ALIGN + _align(len(manifest)) + snapshot.nbytes
        if need > self.slot_capacity:
            raise ValueError(
                f"snapshot v{snapshot.version} needs {need} bytes, the shared-memory slots hold "
                f"{self.slot_capacity}: create the transport with slot_capacity >= slot_bytes_for(snapshot)"
            )
        h = self._header
        active = int(h[_ACTIVE])
        slot = 0 if active == NONE_ACTIVE else 1 - active
        start = self._slot_start(slot)
        h[_SEQ[slot]] += 1  # odd: slot being written
        self._bytes[start : start + 8].view(np.uint64)[0] = len(manifest)
        self._bytes[start + SLOT_ALIGN : start + SLOT_ALIGN + len(manifest)] = np.frombuffer(manifest, np.uint8)
        data = start + SLOT_ALIGN + _align(len(manifest))
        _as_tensor(self._bytes[data : data + snapshot.nbytes]).copy_(snapshot.buffer)
        h[_SEQ[slot]] += 1  # even: slot complete
        h[_VERSION[slot]] = snapshot.version
        h[_ACTIVE] = slot
        h[_GENERATION] += 1

    # -- reader -----------------------------------------------------------------------

    def latest_version(self) -> int | None:
        active = int(self._header[_ACTIVE])
        return None if active == NONE_ACTIVE else int(self._header[_VERSION[active]])

    def pull(self, min_version: int = 0, timeout_s: float = DEFAULT_PULL_TIMEOUT_S) -> Pulled:
        if self.publisher:
            raise WrongRoleError(f"shared memory {self.segment!r}: the publisher cannot pull")
        clock = PullClock()
        h = self._header
        while True:
            active = int(h[_ACTIVE])
            if active == NONE_ACTIVE or int(h[_VERSION[active]]) < min_version:
                if clock.elapsed() > timeout_s:
                    raise PullTimeoutError(
                        f"shared memory {self.segment!r}: no snapshot >= v{min_version} within {timeout_s:g} s "
                        f"(newest: {self.latest_version()})"
                    )
                clock.wait(POLL_INTERVAL_S)
                continue
            seq = int(h[_SEQ[active]])
            try:
                if seq % 2:
                    raise _Lapped
                snapshot = self._copy_slot(active)
                if int(h[_SEQ[active]]) != seq:
                    raise _Lapped
                snapshot.verify()
            except (_Lapped, ChecksumMismatchError):
                if int(h[_SEQ[active]]) == seq and seq % 2 == 0:
                    raise  # the slot did not change under us: corrupted, not torn
                clock.attempts += 1
                if clock.attempts > SHM_MAX_TORN_RETRIES + 1:
                    raise TornReadError(
                        f"shared memory {self.segment!r}: slot {active} was rewritten during "
                        f"{SHM_MAX_TORN_RETRIES + 1} copies in a row; the publisher outpaces this reader"
                    ) from None
                clock.wait(POLL_INTERVAL_S)
                continue
            if snapshot.version < min_version:  # header and slot disagree: a corrupted header
                raise ChecksumMismatchError(
                    f"shared memory {self.segment!r}: header says v{int(h[_VERSION[active]])}, "
                    f"slot {active} holds v{snapshot.version}"
                )
            return clock.record(self.name, snapshot)

    def _copy_slot(self, slot: int) -> Snapshot:
        """The slot's snapshot, copied out, not yet verified; `ChecksumMismatchError` when
        what was read cannot be a whole slot (torn if `seq` moved meanwhile, else corrupted)."""
        start = self._slot_start(slot)
        mlen = int(self._bytes[start : start + 8].view(np.uint64)[0])
        if mlen <= 0 or SLOT_ALIGN + _align(mlen) > self.slot_capacity:
            raise ChecksumMismatchError(
                f"shared memory {self.segment!r}: slot {slot} says its manifest has {mlen} bytes "
                f"(slot capacity {self.slot_capacity})"
            )
        manifest = Manifest.from_json(self._bytes[start + SLOT_ALIGN : start + SLOT_ALIGN + mlen].tobytes())
        data = start + SLOT_ALIGN + _align(mlen)
        if manifest.nbytes < 0 or data + manifest.nbytes > start + self.slot_capacity:
            raise ChecksumMismatchError(
                f"shared memory {self.segment!r}: slot {slot}'s manifest says {manifest.nbytes} bytes, "
                f"more than the slot holds"
            )
        buffer = torch.empty(manifest.nbytes, dtype=torch.uint8)
        buffer.copy_(_as_tensor(self._bytes[data : data + manifest.nbytes]))
        return Snapshot(manifest, buffer)

    def close(self) -> None:
        """Unmap; the publisher also removes the segment."""
        self._header = self._bytes = None  # type: ignore[assignment]
        if self._owner is not None:
            self._owner.close()
            self._owner.unlink()
            self._owner = None
        elif isinstance(self._map, mmap.mmap) and not self._map.closed:
            self._map.close()

    def __enter__(self) -> ShmTransport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
