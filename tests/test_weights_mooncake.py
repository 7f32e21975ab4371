"""Mooncake weight transport (gyre/weights/mooncake.py): a reader process pulls a Qwen3
snapshot bit-exactly from a publisher process over the Transfer Engine's TCP transport on
127.0.0.1; a damaged slot is refused naming the tensor. Skipped without the optional
`mooncake` package (see the module docstring for the install lines)."""

from __future__ import annotations

import multiprocessing as mp
import sys

import pytest
import torch

from gyre.weights.snapshot import from_module
from tests.weights_procs import CHILD_WAIT_S, digests, mooncake_publisher, mooncake_reader, tiny_qwen

SPAWN = mp.get_context("spawn")


def _mooncake_or_skip() -> None:
    """Not installed, or installed without the system library its wheel links (libibverbs.so.1):
    a skip that says which, never a failure."""
    try:
        import mooncake.engine  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"mooncake is not importable here ({exc}); pip's gyre-rl[test] extra and apt's libibverbs1 "
                    "ibverbs-providers provide it (make system-deps)")


def test_missing_package_names_the_install_lines(monkeypatch):
    from gyre.weights import mooncake

    monkeypatch.setitem(sys.modules, "mooncake", None)
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)
    with pytest.raises(ImportError, match=r"pip install 'gyre-rl\[mooncake\]'.*apt-get install -y libibverbs1 ibverbs-providers"):
        mooncake.MooncakeTransport.attach(descriptor="unused.json")


def test_a_reader_process_pulls_a_qwen_snapshot_bit_exactly(tmp_path):
    _mooncake_or_skip()
    model = tiny_qwen(seed=0)
    state_path = tmp_path / "state.pt"
    torch.save(model.state_dict(), state_path)
    descriptor = str(tmp_path / "mooncake.json")
    go = SPAWN.Event()
    queues = [SPAWN.Queue(), SPAWN.Queue()]
    procs = [
        SPAWN.Process(target=mooncake_publisher, args=(descriptor, str(state_path), go, queues[0])),
        SPAWN.Process(target=mooncake_reader, args=(descriptor, go, queues[1])),
    ]
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
    assert version == 1 and checksum == from_module(model, 1).manifest.checksum
    assert got == digests(model)
    assert f"snapshot v2: tensor '{damaged_tensor}'" in refused and "fails its checksum" in refused
    assert record.transport == "mooncake" and record.nbytes > 0 and record.seconds > 0
