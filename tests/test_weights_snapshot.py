"""Snapshots (gyre/weights/snapshot.py): bit-exact round trips, and clear refusals naming the tensor."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest
import torch

from gyre.weights.base import PullRecord
from gyre.weights.snapshot import (
    ALIGNMENT,
    ChecksumMismatchError,
    Manifest,
    ManifestMismatchError,
    Snapshot,
    UnsupportedDtypeError,
    from_module,
    from_state_dict,
    load_into,
)
from tests.weights_procs import digests, tiny_qwen


def test_qwen_round_trip_is_bit_exact_and_stores_tied_weights_once():
    source, target = tiny_qwen(seed=0), tiny_qwen(seed=1)
    assert digests(source) != digests(target)
    snap = from_module(source, version=5)
    snap.verify()
    entries = {e.name: e for e in snap.manifest.entries}
    assert entries["lm_head.weight"].offset == entries["model.embed_tokens.weight"].offset  # tied: once
    assert all(e.offset % ALIGNMENT == 0 for e in snap.manifest.entries)
    assert snap.nbytes < sum(t.numel() * t.element_size() for t in source.state_dict().values())
    load_into(target, snap)
    assert digests(target) == digests(source)
    assert snap.version == 5


def test_every_supported_dtype_scalars_and_empty_tensors_survive():
    state = {
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "f16": torch.randn(4).half(),
        "f64": torch.randn(2, 2, dtype=torch.float64),
        "f8": torch.randn(9).to(torch.float8_e4m3fn),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "i64": torch.tensor(2**62 + 1),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
        "nan": torch.tensor([float("nan"), -0.0, float("inf")]),
        "strided": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous
    }
    snap = from_state_dict(state, version=1)
    again = Snapshot(Manifest.from_json(snap.manifest.to_json()), snap.buffer.clone())
    again.verify()
    out = again.tensors(copy=True)
    assert digests(out) == digests(state)


def test_a_flipped_bit_is_refused_naming_the_tensor():
    snap = from_module(tiny_qwen(seed=0), version=3)
    victim = next(e for e in snap.manifest.entries if e.name == "model.layers.1.mlp.up_proj.weight")
    torn = snap.buffer.clone()
    torn[victim.offset + victim.nbytes - 1] ^= 0x80
    target = tiny_qwen(seed=1)
    before = digests(target)
    with pytest.raises(ChecksumMismatchError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_into(target, Snapshot(snap.manifest, torn))
    assert digests(target) == before  # nothing was touched


def test_a_manifest_from_another_version_is_refused():
    snap = from_module(tiny_qwen(seed=0), version=3)
    forged = dataclasses.replace(snap.manifest, version=4)  # v4's header over v3's checksum
    with pytest.raises(ChecksumMismatchError, match="manifest checksum"):
        Snapshot(forged, snap.buffer).verify()
    with pytest.raises(ChecksumMismatchError, match="buffer is"):
        Snapshot(snap.manifest, snap.buffer[:-1]).verify()


def test_shape_mismatch_names_the_tensor_and_leaves_the_module_alone():
    snap = from_state_dict({"weight": torch.ones(4, 3), "bias": torch.ones(4)}, version=1)
    target = torch.nn.Linear(3, 5)
    before = digests(target)
    with pytest.raises(ManifestMismatchError, match=r"'weight' has shape \[4, 3\] in the snapshot, \[5, 3\]"):
        load_into(target, snap)
    assert digests(target) == before
    with pytest.raises(ManifestMismatchError, match="'bias' missing from the snapshot"):
        load_into(torch.nn.Linear(3, 4), from_state_dict({"weight": torch.ones(4, 3)}, version=1))
    with pytest.raises(ManifestMismatchError, match="'weight' is float64 in the snapshot"):
        load_into(torch.nn.Linear(3, 4, bias=False), from_state_dict({"weight": torch.ones(4, 3).double()}, 1))


def test_unsupported_dtypes_are_named():
    with pytest.raises(UnsupportedDtypeError, match=r"tensor 'z': dtype torch\.complex64"):
        from_state_dict({"ok": torch.ones(2), "z": torch.zeros(2, dtype=torch.complex64)}, version=1)
    snap = from_state_dict({"ok": torch.ones(2)}, version=1)
    odd = dataclasses.replace(snap.manifest, entries=(dataclasses.replace(snap.manifest.entries[0], dtype="int4"),))
    with pytest.raises(UnsupportedDtypeError, match="'ok': dtype 'int4'"):
        Snapshot(odd, snap.buffer).tensors()


def test_garbage_manifest_is_a_checksum_error():
    with pytest.raises(ChecksumMismatchError, match="not valid JSON"):
        Manifest.from_json(b'{"format": 1, "vers')
    with pytest.raises(ChecksumMismatchError, match="malformed"):
        Manifest.from_json(b'{"format": 1, "checksum_algo": "sha256", "entries": [[1]]}')


def test_pull_record_rate():
    rec = PullRecord("shm", 3, 1_000_000, 0.5, datetime.now(timezone.utc), attempts=2, wait_seconds=0.25)
    assert rec.bytes_per_s == pytest.approx(4_000_000)


def test_threaded_hashing_gives_the_same_digests(monkeypatch):
    from gyre.weights import snapshot as module

    state = {f"t{i}": torch.randn(1000 + i) for i in range(20)}
    serial = from_state_dict(state, version=2)
    monkeypatch.setattr(module, "HASH_THREADS", 4)
    monkeypatch.setattr(module, "PARALLEL_HASH_BYTES", 0)
    threaded = from_state_dict(state, version=2)
    assert threaded.manifest == serial.manifest
    torn = threaded.buffer.clone()
    torn[threaded.manifest.entries[17].offset] ^= 1
    with pytest.raises(ChecksumMismatchError, match="tensor 't17'"):
        Snapshot(threaded.manifest, torn).verify()
