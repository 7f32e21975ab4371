"""`gyre run` with `sandbox.type: docker` end to end, against the real engine `make test` starts
(`scripts/docker-engine.sh`): every execution in its own container from the substituted base image,
scored, recorded with the image it ran from, and no container left afterwards."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import duckdb
import pytest

GYRE = [sys.executable, "-m", "gyre.cli.main"]


@pytest.mark.slow
def test_a_docker_run_executes_every_execution_in_a_container_and_leaves_none(tmp_path, tiny_model_dir,
                                                                                docker_image):
    import docker

    config = tmp_path / "run.yaml"
    config.write_text(
        f"name: docker-e2e\nsteps: 2\ncache_dir: {tmp_path / 'cache'}\nmodel:\n  path: {tiny_model_dir}\n"
        "benchmark:\n  num_queries: 16\n  eval_fraction: 0.25\n"
        "evaluation:\n  every_steps: 2\n  samples_per_query: 1\n  max_queries: 2\n"
        "rollout:\n  queries_per_step: 2\n  group_size: 2\n  max_new_tokens: 32\nharness:\n  max_turns: 2\n"
        "sandbox:\n  type: docker\n  image: python:3.11-slim\n"
        f"  docker:\n    base_images:\n      python:3.11-slim: {docker_image}\n"
    )
    client = docker.from_env()
    since = int(time.time()) - 1
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", COLUMNS="160")
    proc = subprocess.run([*GYRE, "run", "--config", str(config), "run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    rows = con.execute("select purpose, image, eval_status, count(*) from executions group by all "
                       "order by all").fetchall()
    note = f"python:3.11-slim -> {docker_image}"
    assert rows == [("eval", note, "ok", 4), ("train", note, "ok", 8)], rows  # 2 rounds of 2; 2 steps of 4
    assert con.execute("select count(*) from calls").fetchone()[0] >= 12
    # the engine made one container per execution, with gyre's label, and none is left
    created = [e for e in client.events(since=since, until=int(time.time()) + 1, decode=True,
                                        filters={"type": "container", "event": "create", "label": "gyre"})
               if re.fullmatch(r"gyre-[se]\d{4}-.+", e["Actor"]["Attributes"]["name"])]  # this run's executions
    assert len(created) == 12 and {e["Actor"]["Attributes"]["image"] for e in created} == {docker_image}
    assert client.containers.list(all=True, filters={"label": "gyre"}) == []
