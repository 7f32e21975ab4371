"""A Claude-Code-shaped session against `gyre proxy serve` with the shipped default config:
a ~50k-token first call (system blocks, a dozen tools with long schemas, CLAUDE.md, tool uses
and tool results of whole files), streamed as Claude Code streams, then a call that extends
it by ~2k tokens; both answered and both recorded token-in/token-out.

Claude Code 2.1.197 stopped at its first call against the default path once ("400 prompt has
50482 tokens; the model's context is 8192"): this is that session, scripted, without the CLI;
and the CLI itself (2.1.197, installed by `.ci/run` where npm's registry answers) against the
same served config.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys

import duckdb
import httpx
import pytest
import yaml

from tests.serve_process import _UVICORN_PORT, REPO, Child

CLI_TIMEOUT_S = 900  # the CLI's session: one ~50k-token prefill of the tiny model on a loaded 2-core box
TOOLS = ["Task", "Bash", "Glob", "Grep", "LS", "ExitPlanMode", "Read", "Edit", "MultiEdit", "Write",
         "NotebookEdit", "WebFetch", "TodoWrite", "WebSearch", "BashOutput", "KillBash"]


def _prose(rng: random.Random, words: int) -> str:
    vocab = ["the", "file", "function", "returns", "test", "module", "when", "path", "call", "value", "error",
             "must", "never", "use", "tool", "output", "command", "before", "after", "user", "repository"]
    return " ".join(rng.choice(vocab) for _ in range(words))


def _code(rng: random.Random, lines: int) -> str:
    return "\n".join(f"{i:>6}\tdef f_{i}(x):  # {_prose(rng, 6)}\n      \t    return x * {i}" for i in range(lines))


def _session(rng: random.Random, files: int) -> dict:
    tools = [{"name": name, "description": _prose(rng, 400),
              "input_schema": {"type": "object", "properties": {
                  "path": {"type": "string", "description": _prose(rng, 30)},
                  "content": {"type": "string", "description": _prose(rng, 30)}},
                  "required": ["path"], "additionalProperties": False,
                  "$schema": "http://json-schema.org/draft-07/schema#"}} for name in TOOLS]
    system = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
               "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": _prose(rng, 2500), "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\nContents of CLAUDE.md:\n" + _prose(rng, 800) + "\n</system-reminder>"},
        {"type": "text", "text": "Implement the package so the tests pass.", "cache_control": {"type": "ephemeral"}}]}]
    for i in range(files):
        use = f"toolu_{i:024d}"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Reading file {i}."},
            {"type": "tool_use", "id": use, "name": "Read", "input": {"file_path": f"/repo/src/m{i}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use, "content": _code(rng, 120)}]})
    return {"model": "claude-sonnet-4-5-20250929", "max_tokens": 16, "system": system, "tools": tools,
            "messages": messages, "metadata": {"user_id": "user_abc_account__session_1"}}


@pytest.mark.slow
def test_a_claude_code_shaped_50k_token_session_is_served_with_the_default_config(tmp_path):
    config = yaml.safe_load((REPO / "configs" / "proxy-local.yaml").read_text())
    assert config["model"]["path"] is None  # the default: the bundled tiny model
    config.update(port=0, cache_dir=str(tmp_path / "cache"), record_path=str(tmp_path / "calls.duckdb"),
                  engines=[{"id": "torch-0"}])
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    child = Child([sys.executable, "-m", "gyre.cli.main", "proxy", "serve", "--config", str(path)])
    headers = {"x-api-key": "local-dev-key", "anthropic-version": "2023-06-01",
               "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"}
    body = _session(random.Random(0), files=4)
    try:
        port = int(child.wait_for(_UVICORN_PORT).group(1))
        url = f"http://127.0.0.1:{port}/v1/messages?beta=true"
        events = []
        with httpx.stream("POST", url, headers=headers, json={**body, "stream": True}, timeout=900) as r:
            assert r.status_code == 200, r.read()
            events = [line[len("event: "):] for line in r.iter_lines() if line.startswith("event: ")]
        assert events[0] == "message_start" and events[-1] == "message_stop"
        first = [m for m in body["messages"]]
        first.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_write", "name": "Write",
             "input": {"file_path": "/repo/src/pkg.py", "content": _code(random.Random(1), 60)}}]})
        first.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_write",
                                                   "content": "File created successfully at: /repo/src/pkg.py"}]})
        r = httpx.post(url, headers=headers, json={**body, "messages": first}, timeout=900)
        assert r.status_code == 200, r.text
        assert r.json()["type"] == "message" and r.json()["usage"]["input_tokens"] > 50_000
        child.proc.send_signal(signal.SIGINT)  # stops in order: every call recorded before it exits
        assert child.proc.wait(timeout=120) == 128 + signal.SIGINT, child.output()
    finally:
        child.stop()
    con = duckdb.connect(str(tmp_path / "calls.duckdb"), read_only=True)
    try:
        rows = con.execute("select c.prompt_tokens, len(t.prompt_ids), c.output_tokens from calls c "
                           "join call_tokens t using (call_id) order by c.started_at").fetchall()
    finally:
        con.close()
    assert len(rows) == 2, rows
    (p1, ids1, out1), (p2, ids2, _) = rows
    assert p1 == ids1 > 50_000 and 0 < out1 <= 16  # the whole prompt, token-in/token-out
    assert 1_000 < p2 - p1 < 6_000  # the second call extends the first by the write and its result
    json.dumps(rows)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("claude") is None, reason="the claude CLI is not installed (npm i -g @anthropic-ai/claude-code)")
def test_the_claude_code_cli_completes_a_session_against_the_default_config(tmp_path):
    """The check above with the real CLI, as a new user runs it (README, configs/proxy-local.yaml):
    `claude -p` pointed at `gyre proxy serve` with the shipped config and the bundled tiny model
    ends by itself (the tiny model answers text, so the session is one call), every call it made
    recorded token-in/token-out with Claude Code's own ~50k-token prompt."""
    config = yaml.safe_load((REPO / "configs" / "proxy-local.yaml").read_text())
    config.update(port=0, cache_dir=str(tmp_path / "cache"), record_path=str(tmp_path / "calls.duckdb"),
                  engines=[{"id": "torch-0"}], max_new_tokens=32)
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    child = Child([sys.executable, "-m", "gyre.cli.main", "proxy", "serve", "--config", str(path)])
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()
    try:
        port = int(child.wait_for(_UVICORN_PORT).group(1))
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
               "ANTHROPIC_API_KEY": "local-dev-key", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "DISABLE_TELEMETRY": "1"}
        done = subprocess.run(["claude", "-p", "Create hello.py that prints hi.", "--max-turns", "3"],
                              cwd=tmp_path / "project", env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
        child.proc.send_signal(signal.SIGINT)  # every call recorded before it exits
        assert child.proc.wait(timeout=120) == 128 + signal.SIGINT, child.output()
    finally:
        child.stop()
    con = duckdb.connect(str(tmp_path / "calls.duckdb"), read_only=True)
    try:
        rows = con.execute("select c.execution_id, c.prompt_tokens, len(t.prompt_ids), c.output_tokens from calls c "
                           "join call_tokens t using (call_id) order by c.started_at").fetchall()
    finally:
        con.close()
    assert rows and all(e == "local-dev" and p == ids and out > 0 for e, p, ids, out in rows), rows
    assert rows[0][1] > 40_000, rows  # Claude Code's system prompt and tools: no context error, served whole
