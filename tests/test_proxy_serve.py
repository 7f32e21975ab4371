"""`gyre proxy serve`: the shipped config loads, and the served proxy answers with its static key."""

from __future__ import annotations

import signal

import duckdb
import httpx
import pytest
import yaml

from gyre.config.run import ConfigError
from gyre.proxy.config import load_proxy_config
from tests.serve_process import REPO, start_gyre_proxy_serve


def test_shipped_config_loads_and_bad_fields_are_named(tmp_path):
    config = load_proxy_config(REPO / "configs" / "proxy-local.yaml")
    assert config.host == "127.0.0.1" and [e.id for e in config.engines] == ["torch-0", "torch-1"]
    assert config.record_path.suffix == ".duckdb"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"engines": [{"id": "a"}], "host": "0.0.0.0"}))
    with pytest.raises(ConfigError, match="host"):
        load_proxy_config(bad)
    bad.write_text(yaml.safe_dump({"engines": [{"id": "a"}], "record_path": "runs/calls.jsonl"}))
    with pytest.raises(ConfigError, match="record_path.*DuckDB"):
        load_proxy_config(bad)


@pytest.mark.slow
def test_serve_answers_and_records_the_call(tmp_path, tiny_model_dir):
    child, port, record = start_gyre_proxy_serve(tmp_path, tiny_model_dir, {"local-dev-key": "local-dev"})
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/messages", headers={"x-api-key": "local-dev-key"}, timeout=60,
                       json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        r = httpx.post(f"http://127.0.0.1:{port}/v1/messages", headers={"x-api-key": "other"}, timeout=10,
                       json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 401
        child.proc.send_signal(signal.SIGINT)
        assert child.proc.wait(timeout=60) == 128 + signal.SIGINT, child.output()
    finally:
        child.stop()
    con = duckdb.connect(str(record), read_only=True)
    try:
        assert con.execute("select execution_id, kind from calls").fetchall() == [("local-dev", "messages")]
    finally:
        con.close()
