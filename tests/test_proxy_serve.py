"""`gyre proxy serve`: the shipped config loads, and the served proxy answers with its static key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gyre.config import ConfigError
from gyre.proxy.config import load_proxy_config

REPO = Path(__file__).resolve().parents[1]


def test_shipped_config_loads_and_bad_fields_are_named(tmp_path):
    config = load_proxy_config(REPO / "configs" / "proxy-local.yaml")
    assert config.host == "127.0.0.1" and [e.id for e in config.engines] == ["torch-0", "torch-1"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"engines": [{"id": "a"}], "host": "0.0.0.0"}))
    with pytest.raises(ConfigError, match="host"):
        load_proxy_config(bad)


@pytest.mark.slow
def test_serve_answers_and_writes_the_record_on_exit(tmp_path, tiny_model_dir):
    config = yaml.safe_load((REPO / "configs" / "proxy-local.yaml").read_text())
    port = 18000 + os.getpid() % 1000
    config.update(port=port, model={"path": str(tiny_model_dir)}, record_path=str(tmp_path / "calls.jsonl"),
                  engines=[{"id": "torch-0"}])
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-c", f"from gyre.proxy.serve import serve; serve({str(path)!r})"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.head(f"http://127.0.0.1:{port}/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
                time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/messages", headers={"x-api-key": "local-dev-key"}, timeout=60,
                       json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        r = httpx.post(f"http://127.0.0.1:{port}/v1/messages", headers={"x-api-key": "other"}, timeout=10,
                       json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    (line,) = (tmp_path / "calls.jsonl").read_text().splitlines()
    assert json.loads(line)["execution_id"] == "local-dev"
