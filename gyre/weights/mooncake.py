"""Weight transport over the Mooncake Transfer Engine (RDMA on a cluster, TCP elsewhere).

On a cluster the train cell's weights should reach rollout nodes by one-sided RDMA reads:
the publisher keeps the snapshot in memory registered with its transfer engine, and each
reader pulls the bytes when it is ready, without the publisher's CPU taking part (unlike a
broadcast, readers come and go: an elastic satellite joining mid-run just reads).

`mooncake` (optional extra `gyre-rl[mooncake]`; on CPU boxes the wheel
`mooncake-transfer-engine-non-cuda`, which needs `apt-get install -y libibverbs1
ibverbs-providers`) is imported only in this module. Engines start in P2P-handshake mode
(no metadata server) on the given host (127.0.0.1 on one box) with the `tcp` protocol by
default (`rdma` where there are NICs).

The publisher registers one buffer of two slots. Each publication fills the slot not
published last, then replaces a small descriptor file (written, then renamed): generation,
version, the engine's segment name (`host:rpc_port`), the slot's address and length, and
the manifest with its checksum. A reader waits for a descriptor whose version is new
enough, reads the slot with `transfer_sync_read` into memory of its own, and verifies the
checksum.

Why a reader never returns half a snapshot: the slot a descriptor of generation g names is
rewritten only for generation g + 2, which starts after descriptor g + 1 is in place. So a
read whose checksum fails while the descriptor still says g cannot have been torn: it is
corruption (`ChecksumMismatchError`). One that fails after the generation moved may have
been torn, and is retried from the new descriptor, at most `MOONCAKE_MAX_TORN_RETRIES`
times. A read that passes its checksum is whole.

Known from mooncake-transfer-engine-non-cuda 0.3.13: with host 127.0.0.1 the traffic stays
on loopback, but the engine's handshake and TCP-transport listeners bind all interfaces
(0.0.0.0; `MC_TCP_BIND_ADDRESS` does not change that). Registering memory costs nothing on
TCP; on RDMA it pins pages, so a reader that pulls often should keep one registered buffer
(not done here: each pull registers the snapshot's own fresh buffer).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

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
from gyre.weights.snapshot import ChecksumMismatchError, Manifest, Snapshot

MOONCAKE_MAX_TORN_RETRIES = 8  # reads a reader throws away because the publisher lapped it
DESCRIPTOR_LAYOUT = 1
SLOT_ALIGN = 4096

INSTALL_HINT = (
    "pip install 'gyre-rl[mooncake]' (on a CPU box: pip install mooncake-transfer-engine-non-cuda) "
    "and apt-get install -y libibverbs1 ibverbs-providers"
)


def _transfer_engine():
    try:
        from mooncake.engine import TransferEngine
    except (ImportError, OSError) as err:
        raise ImportError(f"the Mooncake weight transport needs the Mooncake Transfer Engine: {INSTALL_HINT} ({err})") from err
    return TransferEngine


def _start_engine(host: str, protocol: str, device: str):
    engine = _transfer_engine()()
    rc = engine.initialize(host, "P2PHANDSHAKE", protocol, device)
    if rc != 0:
        raise RuntimeError(f"Mooncake TransferEngine.initialize({host!r}, 'P2PHANDSHAKE', {protocol!r}) returned {rc}")
    return engine


def _register(engine, tensor: torch.Tensor) -> None:
    rc = engine.register_memory(tensor.data_ptr(), tensor.numel())
    if rc != 0:
        raise RuntimeError(f"Mooncake register_memory of {tensor.numel()} bytes returned {rc}")


class MooncakeTransport:
    """One end of a Mooncake transport: `create` (publisher) or `attach` (reader)."""

    name = "mooncake"

    def __init__(self, descriptor: Path, engine, publisher: bool, slots: torch.Tensor | None = None) -> None:
        self.descriptor = Path(descriptor)
        self.publisher = publisher
        self._engine = engine
        self._slots = slots  # publisher: the registered two-slot buffer
        self._generation = 0

    @classmethod
    def create(
        cls, descriptor: Path, slot_capacity: int, host: str = "127.0.0.1", protocol: str = "tcp", device: str = ""
    ) -> MooncakeTransport:
        """A publisher serving snapshots of up to `slot_capacity` bytes, announced at `descriptor`."""
        Path(descriptor).unlink(missing_ok=True)  # a dead publisher's, naming memory no longer served
        engine = _start_engine(host, protocol, device)
        capacity = -(-slot_capacity // SLOT_ALIGN) * SLOT_ALIGN
        slots = torch.zeros(2 * capacity, dtype=torch.uint8)
        _register(engine, slots)
        end = cls(descriptor, engine, publisher=True, slots=slots)
        end.slot_capacity = capacity
        end.segment = f"{host}:{engine.get_rpc_port()}"
        return end

    @classmethod
    def attach(cls, descriptor: Path, host: str = "127.0.0.1", protocol: str = "tcp", device: str = "") -> MooncakeTransport:
        """A reader of the publisher announced at `descriptor` (which need not exist yet)."""
        return cls(descriptor, _start_engine(host, protocol, device), publisher=False)

    # -- publisher --------------------------------------------------------------------

    def publish(self, snapshot: Snapshot) -> None:
        if not self.publisher:
            raise WrongRoleError(f"{self.descriptor}: a Mooncake reader cannot publish")
        if snapshot.nbytes > self.slot_capacity:
            raise ValueError(
                f"snapshot v{snapshot.version} has {snapshot.nbytes} bytes, the Mooncake slots hold {self.slot_capacity}"
            )
        self._generation += 1
        slot = self._generation % 2
        start = slot * self.slot_capacity
        assert self._slots is not None
        self._slots[start : start + snapshot.nbytes].copy_(snapshot.buffer)
        record = {
            "layout": DESCRIPTOR_LAYOUT,
            "generation": self._generation,
            "version": snapshot.version,
            "segment": self.segment,
            "address": self._slots.data_ptr() + start,
            "nbytes": snapshot.nbytes,
            "manifest": snapshot.manifest.to_json().decode(),
        }
        self.descriptor.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.descriptor.name}.", dir=self.descriptor.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            os.replace(tmp, self.descriptor)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    # -- reader -----------------------------------------------------------------------

    def _read_descriptor(self) -> dict | None:
        try:
            raw = json.loads(self.descriptor.read_text())
        except FileNotFoundError:
            return None
        if raw.get("layout") != DESCRIPTOR_LAYOUT:
            raise ValueError(f"{self.descriptor}: descriptor layout {raw.get('layout')!r}, expected {DESCRIPTOR_LAYOUT}")
        return raw

    def pull(self, min_version: int = 0, timeout_s: float = DEFAULT_PULL_TIMEOUT_S) -> Pulled:
        if self.publisher:
            raise WrongRoleError(f"{self.descriptor}: the Mooncake publisher cannot pull")
        clock = PullClock()
        while True:
            desc = self._read_descriptor()
            if desc is None or desc["version"] < min_version:
                if clock.elapsed() > timeout_s:
                    newest = None if desc is None else desc["version"]
                    raise PullTimeoutError(
                        f"{self.descriptor}: no Mooncake snapshot >= v{min_version} within {timeout_s:g} s (newest: {newest})"
                    )
                clock.wait(POLL_INTERVAL_S)
                continue
            manifest = Manifest.from_json(desc["manifest"])
            if manifest.nbytes != desc["nbytes"] or manifest.version != desc["version"]:
                raise ChecksumMismatchError(
                    f"{self.descriptor}: descriptor says v{desc['version']} of {desc['nbytes']} bytes, "
                    f"its manifest v{manifest.version} of {manifest.nbytes}"
                )
            buffer = torch.empty(manifest.nbytes, dtype=torch.uint8)
            self._read(desc["segment"], buffer, desc["address"])
            snapshot = Snapshot(manifest, buffer)
            try:
                snapshot.verify()
            except ChecksumMismatchError:
                now = self._read_descriptor()
                if now is None or now["generation"] == desc["generation"]:
                    raise  # the slot was not rewritten meanwhile: corrupted, not torn
                clock.attempts += 1
                if clock.attempts > MOONCAKE_MAX_TORN_RETRIES + 1:
                    raise TornReadError(
                        f"{self.descriptor}: the publisher rewrote the slot during "
                        f"{MOONCAKE_MAX_TORN_RETRIES + 1} reads in a row; it outpaces this reader"
                    ) from None
                continue
            return clock.record(self.name, snapshot)

    def _read(self, segment: str, buffer: torch.Tensor, address: int) -> None:
        if buffer.numel() == 0:
            return
        _register(self._engine, buffer)
        try:
            rc = self._engine.transfer_sync_read(segment, buffer.data_ptr(), address, buffer.numel())
        finally:
            self._engine.unregister_memory(buffer.data_ptr())
        if rc != 0:
            raise RuntimeError(
                f"Mooncake transfer_sync_read of {buffer.numel()} bytes from {segment} at {address:#x} "
                f"returned {rc} (publisher gone, or the address is not registered there)"
            )

    def close(self) -> None:
        """Withdraw the descriptor and unregister the publisher's slots; the engine stops when
        this object is collected."""
        if self._slots is not None:
            self.descriptor.unlink(missing_ok=True)
            self._engine.unregister_memory(self._slots.data_ptr())
            self._slots = None
        self._engine = None

    def __enter__(self) -> MooncakeTransport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
