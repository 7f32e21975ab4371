"""The serving process's collector (`gyre/proxy/gc_tuning.py`): set while serving, restored after, cycles still
collected; the standalone proxy's config names a bad threshold."""

from __future__ import annotations

import gc
import weakref

import pytest
import yaml

from gyre.config.run import ConfigError
from gyre.proxy.config import load_proxy_config
from gyre.proxy.gc_tuning import GC_THRESHOLD0, serving_gc


class _Node:
    def __init__(self) -> None:
        self.other = self


def test_serving_gc_freezes_what_is_alive_raises_the_threshold_and_restores_both():
    before, frozen_before = gc.get_threshold(), gc.get_freeze_count()
    alive = [[i] for i in range(100)]  # containers alive when serving starts
    with serving_gc(5_000):
        assert gc.get_threshold() == (5_000, *before[1:])
        assert gc.get_freeze_count() >= frozen_before + len(alive)
        # a cycle made while serving is still collected by the young collections, after 5,000 net allocations
        cycle = _Node()
        gone = weakref.ref(cycle)
        del cycle
        kept = [[i] for i in range(6_000)]
        assert gone() is None and len(kept) == 6_000
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen_before


def test_serving_gc_none_changes_nothing_and_a_zero_threshold_is_refused():
    before, frozen_before = gc.get_threshold(), gc.get_freeze_count()
    with serving_gc(None):
        assert gc.get_threshold() == before and gc.get_freeze_count() == frozen_before
    with pytest.raises(ValueError, match="at least 1"):
        with serving_gc(0):
            pass
    assert gc.get_threshold() == before and gc.isenabled()


def test_the_proxy_config_sets_the_threshold_and_names_a_bad_one(tmp_path):
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump({"engines": [{"id": "a"}]}))
    assert load_proxy_config(path).gc_threshold == GC_THRESHOLD0
    path.write_text(yaml.safe_dump({"engines": [{"id": "a"}], "gc_threshold": None}))
    assert load_proxy_config(path).gc_threshold is None
    path.write_text(yaml.safe_dump({"engines": [{"id": "a"}], "gc_threshold": 500}))
    with pytest.raises(ConfigError, match="gc_threshold"):
        load_proxy_config(path)
