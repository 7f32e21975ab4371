"""`gyre run` with `sandbox.type: docker` end to end, against the real engine `make test` starts
(`scripts/docker-engine.sh`): every execution in its own container from the substituted base image,
scored, recorded with the image it ran from, and no container left afterwards."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
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
    # streamed while the run goes: the engine keeps only its last 256 events, and every evaluation's container and
    # each exec add theirs
    events = client.events(decode=True, filters={"type": "container", "event": "create", "label": "gyre"})
    seen: list[dict] = []
    watcher = threading.Thread(target=lambda: seen.extend(events), daemon=True)
    watcher.start()
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", COLUMNS="160")
    # count-lines cannot be scored here (its test.sh installs uv from astral.sh): run anyway, to see it dropped
    proc = subprocess.run([*GYRE, "run", "--config", str(config), "--allow-unscorable", "run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    time.sleep(1.0)  # the last events on their way
    events.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    rows = con.execute("select purpose, image, eval_status, count(*) from executions group by all "
                       "order by all").fetchall()
    note = f"python:3.11-slim -> {docker_image}"
    assert rows == [("eval", note, "ok", 4), ("train", note, "ok", 8)], rows  # 2 rounds of 2; 2 steps of 4
    assert con.execute("select count(*) from calls").fetchone()[0] >= 12
    details = [d for (d,) in con.execute("select eval_detail from executions").fetchall()]
    assert all(f"in a fresh container of {note}" in d for d in details), details  # the image the agent ran in
    # the engine made one container per execution, with gyre's label, and one per evaluation (a fresh one of the
    # same image, as NL2RepoBench upstream tests), and none is left
    names = [e["Actor"]["Attributes"]["name"] for e in seen]
    created = [e for e in seen if re.fullmatch(r"gyre-[se]\d{4}-.+", e["Actor"]["Attributes"]["name"])]
    assert sum(name.startswith("gyre-eval-") for name in names) >= 12, names
    assert len(created) == 12 and {e["Actor"]["Attributes"]["image"] for e in created} == {docker_image}
    assert client.containers.list(all=True, filters={"label": "gyre"}) == []


AGENT = """
import json, os, urllib.request
body = {"model": os.environ["GYRE_MODEL"], "max_tokens": 16,
        "messages": [{"role": "user", "content": os.environ["GYRE_INSTRUCTION"]}]}
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
                                 data=json.dumps(body).encode(), headers={
                                     "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                     "Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request, timeout=120))
open("reply.txt", "w").write(reply["choices"][0]["message"]["content"] or "")
"""


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "fixtures"), [("terminal-bench", ["terminal_bench/csv-rows"]),
                                                 ("harbor", ["harbor/count-lines"])])
def test_terminal_bench_and_harbor_runs_build_each_task_image_and_score_in_it(tmp_path, tiny_model_dir,
                                                                               docker_image, kind, fixtures):
    """A step of Terminal-Bench or Harbor with `sandbox.type: docker`: each task's Dockerfile is built (its FROM
    mapped to the local base by `"*"`; count-lines' `docker_image` is not here and is never pulled), the agent and
    the tests run in that image's container; a task whose build needs the network (csv-rows: `apt-get install`)
    is recorded `sandbox_error` and dropped. Harbor's step runs a CLI harness (`harness.type: command`: `AGENT`, a
    python3 agent calling the OpenAI API) in each container: its calls reach the proxy through the bridge (the
    container has no network) and are recorded under their execution."""
    import shutil
    from pathlib import Path

    import docker

    from tests.test_benchmarks_formats import write_harbor, write_terminal_bench

    bench = tmp_path / "bench"
    for fixture in fixtures:
        shutil.copytree(Path(__file__).parent / "fixtures" / "realformats" / fixture, bench / Path(fixture).name)
    (write_terminal_bench if kind == "terminal-bench" else write_harbor)(bench)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"name: docker-{kind}\nsteps: 1\ncache_dir: {tmp_path / 'cache'}\nmodel:\n  path: {tiny_model_dir}\n"
        f"benchmark:\n  kind: {kind}\n  path: {bench}\n"
        "rollout:\n  queries_per_step: 2\n  group_size: 2\n  max_new_tokens: 32\n"
        + ("harness:\n  max_turns: 2\n" if kind == "terminal-bench" else
           f"harness:\n  type: command\n  command: [python3, -c, {json.dumps(AGENT)}]\n")
        + f"sandbox:\n  type: docker\n  image: {docker_image}\n  docker:\n    base_images:\n      '*': {docker_image}\n"
    )
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", COLUMNS="160")
    # count-lines cannot be scored here (its test.sh installs uv from astral.sh): run anyway, to see it dropped
    proc = subprocess.run([*GYRE, "run", "--config", str(config), "--allow-unscorable", "run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    rows = con.execute("select query_id, status, image, eval_status, eval_detail, error, execution_id, "
                       "(select count(*) from calls c where c.execution_id = e.execution_id) from executions e "
                       "order by all").fetchall()
    assert len(rows) == 4, (rows, proc.stdout[-2000:] + proc.stderr[-2000:])
    for query_id, status, image, eval_status, detail, error, execution_id, calls in rows:
        if kind == "harbor":  # the CLI agent's one call through the bridge, and the file it wrote
            assert status == "completed" and calls == 1, (query_id, status, calls, error)
            assert (tmp_path / "run" / "workspaces" / execution_id / "reply.txt").is_file()
        if query_id == "csv-rows":  # its Dockerfile runs apt-get: no network for builds here
            assert status == "sandbox_error" and "task csv-rows: its image did not build" in error, error
            assert eval_status == "error" and "no sandbox started" in detail, detail
        else:
            assert f"built Dockerfile of {query_id} as gyre-task:" in image and docker_image in image, image
        if query_id == "count-lines":  # its docker_image cannot be pulled here (never tried): built instead
            assert image.startswith("ghcr.io/example/count-lines:20251031 is not here: built"), image
            # its test.sh installs uv from astral.sh: unscorable here, said so, never a 0
            assert eval_status == "error" and "unscorable here" in detail, detail
        elif query_id != "csv-rows":
            assert eval_status == "ok" and detail.startswith("in container"), (query_id, detail)
    client = docker.from_env()
    assert client.containers.list(all=True, filters={"label": "gyre"}) == []
    for image in client.images.list(name="gyre-task"):
        if image.labels.get("gyre.task") in ("csv-rows", "hello", "count", "count-lines"):
            client.images.remove(image.id, force=True)
