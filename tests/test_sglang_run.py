"""`rollout.engine: sglang` through a run: the coordinator, the live cells and `gyre proxy serve`
build SGLang adapters from config and drive them like the torch engine.

SGLang cannot serve on this CPU box, so the servers are the faithful fake of its HTTP API
(`tests/sglang_fake.py`, written from SGLang 0.5.23's source): its tokens are not the tiny
model's, so the policy never solves a query, but every call, weight update and version goes
through the same code as with a real server.
"""

from __future__ import annotations

import duckdb
import pytest

from gyre.cells import events as ev
from gyre.config.run import RunConfig
from gyre.engines.factory import EngineConfigError, rollout_engine
from gyre.engines.sglang.adapter import SGLangRolloutEngine
from gyre.proxy.config import ProxyServeConfig
from gyre.proxy.serve import build
from gyre.runtime.coordinator import Coordinator
from gyre.runtime.live.cells import LiveCells
from tests.sglang_fake import FakeSGLang


def _config(tiny_model_dir, tmp_path, urls: list[str], **scheduler) -> RunConfig:
    return RunConfig.model_validate({
        "name": "sglang", "steps": 2, "cache_dir": str(tmp_path / "cache"),
        "model": {"path": str(tiny_model_dir)},
        "benchmark": {"num_queries": 16},
        "rollout": {"engine": "sglang", "sglang_urls": urls, "queries_per_step": 1, "group_size": 2,
                    "max_new_tokens": 8, "sglang_healthy_timeout_s": 10},
        "harness": {"max_turns": 2},
        "scheduler": scheduler,
    })  # fmt: skip


@pytest.fixture
def servers():
    started = [FakeSGLang(context_len=8192, token_delay_s=0.0005).start() for _ in range(3)]
    yield started
    for server in started:
        server.stop()


def test_a_cell_scheduler_run_rolls_out_on_sglang_servers_and_publishes_each_version_to_them(
        tiny_model_dir, tmp_path, servers):
    config = _config(tiny_model_dir, tmp_path, [s.base_url for s in servers], policy="colocate", num_cells=2,
                     executions_per_micro_step=2)
    coord = Coordinator(config, tmp_path / "run")
    try:
        assert isinstance(coord.rollout, SGLangRolloutEngine) and coord.rollout.engine_id == "sglang-0"
        cells = LiveCells(coord, config.steps)
        # each cell's server was given the run's start weights (version 0) before any call
        first = [s.calls[0] for s in servers[:2]]
        assert all(path == "/update_weights_from_disk" and body["model_path"] == str(coord.model_dir)
                   and body["weight_version"] == "0" for path, body in first)
        records = cells.run()
        cells.close()
        assert [r.policy_version for r in records] == [1, 2]
        assert [c.version for c in cells.log.of(ev.PublishWeights)] == [1, 2]
    finally:
        coord.close()
    # every routed server holds the newest version; its updates named each version in order
    updates = [b["weight_version"] for p, b in servers[0].calls if p == "/update_weights_from_disk"]
    assert updates == ["0", "1", "2"]
    assert servers[0].weight_version == "2"
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    engines = {row[0] for row in con.execute("select distinct engine_id from calls").fetchall()}
    assert engines and engines <= {"sglang-0", "cell-1"}
    versions = con.execute("select min(policy_version), max(policy_version) from calls").fetchone()
    assert versions[0] == 0 and versions[1] <= 1  # step 1's executions were dispatched with version <= 1
    # generate carried input ids and asked for log-probs, never text (which server served is the
    # router's choice: with calls this short every pick can find both idle and take the same one)
    generate = [b for server in servers[:2] for p, b in server.calls if p == "/generate"]
    assert generate and all("input_ids" in b and b["return_logprob"] is True and "text" not in b for b in generate)


def test_too_few_sglang_servers_is_a_clear_error_naming_the_field(tiny_model_dir, tmp_path, servers):
    config = _config(tiny_model_dir, tmp_path, [servers[0].base_url])
    with pytest.raises(EngineConfigError, match=r"rollout engine 1 \(cell-1\).*rollout.sglang_urls names 1"):
        rollout_engine(config, tiny_model_dir, 1, "cell-1", seed=1)


def test_a_server_that_never_becomes_healthy_stops_the_run_naming_it(tiny_model_dir, tmp_path, servers):
    servers[0].unhealthy = True
    config = _config(tiny_model_dir, tmp_path, [servers[0].base_url])
    config.rollout.sglang_healthy_timeout_s = 1.0
    with pytest.raises(Exception, match=servers[0].base_url):
        rollout_engine(config, tiny_model_dir, 0, "sglang-0", seed=0)


def test_proxy_serve_routes_to_an_sglang_engine_from_config(tiny_model_dir, tmp_path, servers):
    config = ProxyServeConfig.model_validate({
        "model": {"path": str(tiny_model_dir)}, "cache_dir": str(tmp_path / "cache"),
        "engines": [{"id": "sg-0", "type": "sglang", "url": servers[0].base_url},
                    {"id": "torch-0", "prefix_cache_bytes": 0}],
    })  # fmt: skip
    _, router, _, engines = build(config)
    try:
        assert [type(e).__name__ for e in engines] == ["SGLangRolloutEngine", "TorchRolloutEngine"]
        assert engines[0].max_context == 8192
        assert engines[1].prefix_cache is None  # prefix_cache_bytes: 0 turns it off
    finally:
        for engine in engines:
            engine.close()
    with pytest.raises(ValueError, match="type sglang needs `url`"):
        ProxyServeConfig.model_validate({"engines": [{"id": "sg", "type": "sglang"}]})


@pytest.mark.parametrize("policy", ["colocate", "elastic"])  # at a switch back to rollout; at a publication
def test_a_cell_whose_server_refuses_the_new_weights_leaves_the_run_and_the_run_goes_on(
        tiny_model_dir, tmp_path, servers, policy):
    """Cell 1's server cannot load version 1 (it answers 400 and rolls back, as SGLang does on a
    snapshot whose shapes do not match): the cell is failed with that error recorded, its calls go
    elsewhere, and the run finishes its steps on cell 0."""
    servers[1].refuse_versions_from = 1
    config = _config(tiny_model_dir, tmp_path, [s.base_url for s in servers], policy=policy, num_cells=2,
                     executions_per_micro_step=2)
    coord = Coordinator(config, tmp_path / "run")
    try:
        cells = LiveCells(coord, config.steps)
        records = cells.run()
        cells.close()
        assert [r.policy_version for r in records] == [1, 2]
        assert cells.scheduler.state.cells[1].role is ev.Role.failed
        assert [(f.cell_id, f.what) for f in cells.faults.records] == [(1, "failed")]
        assert "cell-1" not in coord.router.load()
    finally:
        coord.close()
    assert servers[0].weight_version == "2"
    refused = [b["weight_version"] for p, b in servers[1].calls if p == "/update_weights_from_disk"]
    assert refused[0] == "0" and "1" in refused and servers[1].weight_version == "0"
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    faults = con.execute("select cell, what from cell_faults").fetchall()
    assert faults == [(1, "failed")]


@pytest.mark.parametrize("policy", ["colocate", "elastic"])
def test_a_cell_whose_server_refused_one_version_comes_back_at_the_next_publication(
        tiny_model_dir, tmp_path, servers, policy):
    """Cell 1's server refuses version 1 only (a snapshot it could not read, a server briefly
    unhealthy): the cell fails, version 2's publication is offered to it, it loads it, rejoins
    the run and serves calls again."""
    servers[1].refuse_versions_from, servers[1].refuse_versions_to = 1, 2
    config = _config(tiny_model_dir, tmp_path, [s.base_url for s in servers], policy=policy, num_cells=2,
                     executions_per_micro_step=2).model_copy(update={"steps": 3})
    coord = Coordinator(config, tmp_path / "run")
    try:
        cells = LiveCells(coord, config.steps)
        records = cells.run()
        cells.close()
        assert [r.policy_version for r in records] == [1, 2, 3]
        assert cells.scheduler.state.cells[1].role is not ev.Role.failed
        assert [(f.cell_id, f.what) for f in cells.faults.records] == [(1, "failed"), (1, "rejoined")]
        assert cells.faults.refused == {}
    finally:
        coord.close()
    calls = [(p, b.get("weight_version")) for p, b in servers[1].calls]
    back = calls.index(("/update_weights_from_disk", "2"))
    assert ("/update_weights_from_disk", "1") in calls[:back]
    assert ("/generate", None) in calls[back:]  # it served calls again after loading version 2
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    assert con.execute("select cell, what from cell_faults order by at_s").fetchall() == [(1, "failed"), (1, "rejoined")]
