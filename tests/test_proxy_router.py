"""The engine router: sticky by execution, least-loaded otherwise, drain, bounded waits."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gyre.benches.proxy import NullEngine
from gyre.proxy.router import EngineRouter, NoEngineError


def _engines(*ids):
    return [NullEngine([1], engine_id=i) for i in ids]


def test_sticky_by_execution_and_least_loaded_for_new_ones():
    router = EngineRouter(_engines("a", "b"))
    first = router.try_acquire("x")
    second = router.try_acquire("y")
    assert {first.engine_id, second.engine_id} == {"a", "b"}  # least-loaded spreads them
    router.release(first)
    router.release(second)
    again = [router.try_acquire("x") for _ in range(3)]
    assert {lease.engine_id for lease in again} == {first.engine_id}  # sticky, whatever the load
    assert router.try_acquire("z", avoid=frozenset({"a"})).engine_id == "b"
    assert router.try_acquire("z2", avoid=frozenset({"a", "b"})) is not None  # avoid is a preference


def test_drain_stops_routing_signals_attempts_and_waits_for_them():
    router = EngineRouter(_engines("a", "b"))
    leases = [router.try_acquire(f"e{i}") for i in range(4)]
    on_a = [lease for lease in leases if lease.engine_id == "a"]
    started = time.monotonic()  # before the timer starts: a loaded box may pause this thread in between
    threading.Timer(0.1, lambda: [router.release(lease) for lease in on_a]).start()
    assert router.drain("a", timeout_s=5)
    assert time.monotonic() - started >= 0.09
    assert all(lease.stop.is_set() for lease in on_a)
    assert not any(lease.stop.is_set() for lease in leases if lease.engine_id == "b")
    assert all(router.try_acquire(f"e{i}").engine_id == "b" for i in range(4))  # stickiness yields to the drain
    assert router.drain("b", timeout_s=0.05) is False  # still busy
    router.resume("a")
    assert router.try_acquire("new").engine_id == "a"
    assert [e.engine_id for e in router.engines()] == ["a", "b"]


def test_acquire_waits_for_a_registration_then_gives_up_when_bounded():
    router = EngineRouter([], max_wait_s=5)
    threading.Timer(0.1, router.register, [NullEngine([1], engine_id="late")]).start()
    assert asyncio.run(router.acquire("x")).engine_id == "late"
    router.deregister("late")
    router.max_wait_s = 0.05
    with pytest.raises(NoEngineError):
        asyncio.run(router.acquire("x"))
