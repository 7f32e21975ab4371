"""A policy's weights as one versioned, checksummed byte buffer.

Every weight transport (`shm.py`, `dist.py`, `mooncake.py`) moves the same thing: one
contiguous byte buffer holding all tensors of a state dict back to back, plus a small
manifest saying where each tensor lies (name, dtype, shape, offset, nbytes), the policy
version and a checksum. Moving one buffer is what shared memory, a collective broadcast
and an RDMA read are good at; the manifest is what turns it back into tensors.

The checksum is two-level so that a mismatch names the tensor: each tensor's bytes get a
sha256, and the snapshot's checksum is the sha256 of the manifest (version, names, dtypes,
shapes, offsets) followed by those per-tensor digests. Building and verifying read every
byte once. A reader verifies on every pull (`verify`), so a torn or corrupted buffer, or a
manifest paired with another version's buffer, is refused, never loaded.

Tensors that share storage (tied embeddings) are stored once: later names point at the
first one's offset. Offsets are aligned to `ALIGNMENT` bytes so `tensors()` can return
zero-copy views.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

ALIGNMENT = 64  # bytes; every tensor starts at a multiple of this
CHECKSUM_ALGO = "sha256"
# hashlib releases the GIL, so big snapshots are hashed a tensor per thread: at most this many
HASH_THREADS = min(8, os.cpu_count() or 1)
PARALLEL_HASH_BYTES = 32 * 2**20  # below this a snapshot is hashed in the calling thread
MANIFEST_FORMAT = 1

# The dtypes a snapshot carries, by the name written into the manifest.
DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class SnapshotError(ValueError):
    """A snapshot that must not be loaded; the message names the tensor where one is at fault."""


class ChecksumMismatchError(SnapshotError):
    """The bytes (or the manifest) are not what the publisher checksummed: torn or corrupted."""


class ManifestMismatchError(SnapshotError):
    """The snapshot's tensors do not fit the target (names, shapes or dtypes differ)."""


class UnsupportedDtypeError(SnapshotError):
    """A tensor's dtype has no entry in `DTYPES`."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # a key of DTYPES
    shape: tuple[int, ...]
    offset: int  # bytes from the buffer's start
    nbytes: int
    digest: str  # sha256 of this tensor's bytes, hex


@dataclass(frozen=True)
class Manifest:
    version: int
    entries: tuple[TensorEntry, ...]
    nbytes: int  # the buffer's length
    checksum: str  # see the module docstring
    checksum_algo: str = CHECKSUM_ALGO

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "version": self.version,
                "nbytes": self.nbytes,
                "checksum": self.checksum,
                "checksum_algo": self.checksum_algo,
                "entries": [
                    [e.name, e.dtype, list(e.shape), e.offset, e.nbytes, e.digest] for e in self.entries
                ],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Manifest:
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:  # e.g. a torn side channel
            raise ChecksumMismatchError(f"snapshot manifest is not valid JSON ({err})") from err
        if not isinstance(raw, dict):
            raise ChecksumMismatchError(f"snapshot manifest is a JSON {type(raw).__name__}, not an object")
        if raw.get("format") != MANIFEST_FORMAT:
            raise SnapshotError(f"snapshot manifest format {raw.get('format')!r}, this gyre reads {MANIFEST_FORMAT}")
        if raw.get("checksum_algo") != CHECKSUM_ALGO:
            raise SnapshotError(f"snapshot checksum {raw.get('checksum_algo')!r}, this gyre checks {CHECKSUM_ALGO}")
        try:
            entries = tuple(
                TensorEntry(str(name), str(dtype), tuple(int(d) for d in shape), int(offset), int(nbytes), str(digest))
                for name, dtype, shape, offset, nbytes, digest in raw["entries"]
            )
            return cls(int(raw["version"]), entries, int(raw["nbytes"]), str(raw["checksum"]), raw["checksum_algo"])
        except (KeyError, TypeError, ValueError) as err:
            raise ChecksumMismatchError(f"snapshot manifest is malformed ({err!r})") from err


def _snapshot_checksum(version: int, entries: tuple[TensorEntry, ...], nbytes: int) -> str:
    head = json.dumps(
        [version, nbytes, [[e.name, e.dtype, list(e.shape), e.offset, e.nbytes] for e in entries]],
        separators=(",", ":"),
    ).encode()
    h = hashlib.sha256(head)
    for e in entries:
        h.update(bytes.fromhex(e.digest))
    return h.hexdigest()


def _digest(buffer: torch.Tensor, offset: int, nbytes: int) -> str:
    return hashlib.sha256(buffer[offset : offset + nbytes].numpy().data).hexdigest()  # no copy


def _digests(buffer: torch.Tensor, spans: Iterable[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """sha256 of each distinct (offset, nbytes) span of `buffer`, in threads when it pays."""
    unique = list(dict.fromkeys(spans))
    if HASH_THREADS > 1 and sum(n for _, n in unique) >= PARALLEL_HASH_BYTES:
        with ThreadPoolExecutor(HASH_THREADS) as pool:
            return dict(zip(unique, pool.map(lambda span: _digest(buffer, *span), unique)))
    return {span: _digest(buffer, *span) for span in unique}


@dataclass(frozen=True)
class Snapshot:
    """`buffer` is a 1-D, contiguous CPU uint8 tensor of `manifest.nbytes` bytes."""

    manifest: Manifest
    buffer: torch.Tensor

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def nbytes(self) -> int:
        return self.manifest.nbytes

    def verify(self) -> None:
        """Raise `ChecksumMismatchError` naming the first tensor whose bytes differ."""
        m = self.manifest
        if self.buffer.dtype != torch.uint8 or self.buffer.dim() != 1 or self.buffer.numel() != m.nbytes:
            raise ChecksumMismatchError(
                f"snapshot v{m.version}: buffer is {tuple(self.buffer.shape)} {self.buffer.dtype}, "
                f"the manifest says {m.nbytes} uint8 bytes"
            )
        for e in m.entries:
            if e.offset < 0 or e.offset + e.nbytes > m.nbytes:
                raise ChecksumMismatchError(
                    f"snapshot v{m.version}: tensor {e.name!r} lies at bytes {e.offset}..{e.offset + e.nbytes}, "
                    f"outside the {m.nbytes}-byte buffer"
                )
        got = _digests(self.buffer, ((e.offset, e.nbytes) for e in m.entries))
        for e in m.entries:
            if got[e.offset, e.nbytes] != e.digest:
                raise ChecksumMismatchError(
                    f"snapshot v{m.version}: tensor {e.name!r} ({e.nbytes} bytes at offset {e.offset}) "
                    f"fails its checksum: torn or corrupted in transit"
                )
        if _snapshot_checksum(m.version, m.entries, m.nbytes) != m.checksum:
            raise ChecksumMismatchError(
                f"snapshot v{m.version}: manifest checksum mismatch (version, names, shapes or offsets altered)"
            )

    def tensors(self, copy: bool = False) -> dict[str, torch.Tensor]:
        """Name -> tensor. Views into `buffer` unless `copy` (then each tensor owns its memory)."""
        out: dict[str, torch.Tensor] = {}
        for e in self.manifest.entries:
            if e.dtype not in DTYPES:
                raise UnsupportedDtypeError(f"snapshot tensor {e.name!r}: dtype {e.dtype!r} is not one of {sorted(DTYPES)}")
            t = self.buffer[e.offset : e.offset + e.nbytes].view(DTYPES[e.dtype]).view(e.shape)
            out[e.name] = t.clone() if copy else t
        return out


def from_state_dict(state: Mapping[str, torch.Tensor] | torch.nn.Module, version: int) -> Snapshot:
    """Pack a state dict (or a module's) into one buffer, bit-exactly, and checksum it."""
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    planned: list[tuple[str, torch.Tensor, str, int]] = []  # name, tensor, dtype name, offset
    first_at: dict[tuple[int, int, torch.dtype, tuple[int, ...]], int] = {}  # shared storage -> offset
    end = 0
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise SnapshotError(f"state dict entry {name!r} is a {type(tensor).__name__}, not a tensor")
        dtype = _DTYPE_NAMES.get(tensor.dtype)
        if dtype is None:
            raise UnsupportedDtypeError(
                f"tensor {name!r}: dtype {tensor.dtype} is not supported by snapshots (supported: {sorted(DTYPES)})"
            )
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.dtype, tuple(tensor.shape))
        if tensor.is_contiguous() and tensor.numel() and key in first_at:
            planned.append((name, tensor, dtype, first_at[key]))
            continue
        offset = -(-end // ALIGNMENT) * ALIGNMENT
        if tensor.is_contiguous() and tensor.numel():
            first_at[key] = offset
        planned.append((name, tensor, dtype, offset))
        end = offset + tensor.numel() * tensor.element_size()
    buffer = torch.zeros(end, dtype=torch.uint8)
    entries: list[TensorEntry] = []
    spans: dict[tuple[int, int], None] = {}  # (offset, nbytes): empty tensors share offsets too
    for name, tensor, dtype, offset in planned:
        span = (offset, tensor.numel() * tensor.element_size())
        if span not in spans:
            raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            buffer[offset : offset + span[1]].copy_(raw)
            spans[span] = None
    digests = _digests(buffer, spans)
    for name, tensor, dtype, offset in planned:
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(TensorEntry(name, dtype, tuple(tensor.shape), offset, nbytes, digests[offset, nbytes]))
    frozen = tuple(entries)
    return Snapshot(Manifest(version, frozen, end, _snapshot_checksum(version, frozen, end)), buffer)


def from_module(module: torch.nn.Module, version: int) -> Snapshot:
    return from_state_dict(module.state_dict(), version)


def check_fits(snapshot: Snapshot, module: torch.nn.Module) -> None:
    """Raise `ManifestMismatchError` naming every tensor missing, unexpected or of another shape/dtype."""
    target = module.state_dict()
    entries = {e.name: e for e in snapshot.manifest.entries}
    problems: list[str] = []
    for name in target.keys() - entries.keys():
        problems.append(f"{name!r} missing from the snapshot")
    for name in entries.keys() - target.keys():
        problems.append(f"{name!r} is not a tensor of the module")
    for name in sorted(target.keys() & entries.keys()):
        want, got = target[name], entries[name]
        if tuple(want.shape) != got.shape:
            problems.append(f"{name!r} has shape {list(got.shape)} in the snapshot, {list(want.shape)} in the module")
        elif _DTYPE_NAMES.get(want.dtype) != got.dtype:
            problems.append(f"{name!r} is {got.dtype} in the snapshot, {want.dtype} in the module")
    if problems:
        raise ManifestMismatchError(
            f"snapshot v{snapshot.version} does not fit {type(module).__name__}: " + "; ".join(sorted(problems))
        )


@torch.no_grad()
def load_into(module: torch.nn.Module, snapshot: Snapshot, verify: bool = True) -> None:
    """Copy the snapshot's tensors into `module` in place (any device), bit-exactly.

    Checks everything before touching a parameter, so a bad snapshot leaves the module as it was.
    """
    if verify:
        snapshot.verify()
    check_fits(snapshot, module)
    tensors = snapshot.tensors()
    for name, target in module.state_dict().items():
        target.copy_(tensors[name])
