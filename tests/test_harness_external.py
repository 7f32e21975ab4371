"""Harnesses that run inside the sandbox (command, claude-code, mini-swe-agent) against the real proxy.

The `command` harness runs for real: a script inside a bubblewrap sandbox calls the proxy
over the bridge with its execution key, and the proxy records the call. Claude Code runs
for real only when its CLI is installed and the proxy serves `/v1/messages` (else skipped
with the reason); its and mini-swe-agent's command lines and environments are unit-tested.
"""

from __future__ import annotations

import socket
import time

import pytest

from gyre.benchmarks import generate_tiny, load_benchmark
from gyre.engines.models.hf import stop_token_ids
from gyre.harnesses.base import ModelEndpoint
from gyre.harnesses.claude_code import ClaudeCodeHarness, find_claude
from gyre.harnesses.command import CommandHarness
from gyre.harnesses.external import endpoint_env
from gyre.harnesses.mini_swe_agent import MiniSweAgentHarness
from gyre.net.server_thread import ServerThread
from gyre.proxy.app import create_app
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import SessionRegistry
from gyre.proxy.toolcalls import parser_for
from gyre.records import ExecutionStatus
from gyre.sandboxes.local.isolation import probe_bwrap
from gyre.sandboxes.local.sandbox import LocalSandbox
from tests.fakes import ScriptedEngine

needs_bwrap = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing: the bridge needs it")

CLIENT = r"""
import json, os, socket, sys, urllib.request
body = json.dumps({"model": os.environ["GYRE_MODEL"], "messages": [{"role": "user", "content": os.environ["GYRE_INSTRUCTION"]}]})
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body.encode(),
                             {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(req, timeout=30))
open("answer.txt", "w").write(reply["choices"][0]["message"]["content"])
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
    print("OTHER-PORT-REACHED")
except OSError:
    open("other_port.txt", "w").write("unreachable")
"""


def _proxy(tokenizer, replies):
    engine = ScriptedEngine(tokenizer, replies)
    sessions = SessionRegistry()
    app = create_app(EngineRouter([engine]), sessions, tokenizer, model_name="tiny",
                     stop_token_ids=stop_token_ids(tokenizer))
    return sessions, ServerThread(app).start()


def _query(tmp_path):
    return load_benchmark("nl2repo", generate_tiny(tmp_path / "bench", num_queries=1, seed=1), "tiny")[0]


@needs_bwrap
def test_command_harness_reaches_the_proxy_and_nothing_else(tmp_path, tiny_tokenizer):
    sessions, server = _proxy(tiny_tokenizer, ["hello from the model"])
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    key = sessions.mint("exec-1")
    query = _query(tmp_path)
    sandbox = LocalSandbox.create(query, tmp_path / "ws", isolation="bwrap")
    try:
        harness = CommandHarness(["python3", "-c", CLIENT, str(other.getsockname()[1])])
        outcome = harness.run(query, sandbox, ModelEndpoint(server.base_url, key, "tiny"), time.monotonic() + 60)
    finally:
        sandbox.close()
        server.stop()
        other.close()
    assert outcome.status is ExecutionStatus.completed, outcome.error
    assert (sandbox.workspace / "answer.txt").read_text() == "hello from the model"
    assert (sandbox.workspace / "other_port.txt").read_text() == "unreachable"
    assert len(sessions.close("exec-1").calls) == 1  # recorded token-in/token-out under this execution


def test_command_harness_timeout_and_failure(tmp_path):
    query = _query(tmp_path)
    endpoint = ModelEndpoint("http://127.0.0.1:9999/v1", "k", "m")
    sandbox = LocalSandbox.create(query, tmp_path / "ws")
    slow = CommandHarness(["sh", "-c", "echo partial > work.txt; sleep 30"]).run(
        query, sandbox, endpoint, time.monotonic() + 1.5)
    assert slow.status is ExecutionStatus.harness_timeout
    assert (sandbox.workspace / "work.txt").read_text() == "partial\n"  # kept for scoring
    failed = CommandHarness(["sh", "-c", "echo boom >&2; exit 4"]).run(query, sandbox, endpoint, time.monotonic() + 10)
    assert failed.status is ExecutionStatus.harness_error and "exit 4" in failed.error and "boom" in failed.error
    instr = CommandHarness(["sh", "-c", 'test "$(cat "$GYRE_INSTRUCTION_FILE")" = "$(printf %s "$GYRE_INSTRUCTION")"']).run(
        query, sandbox, endpoint, time.monotonic() + 10)
    assert instr.status is ExecutionStatus.completed


def test_claude_code_command_line_and_environment():
    harness = ClaudeCodeHarness(max_turns=30)
    endpoint = ModelEndpoint("http://127.0.0.1:8123/v1", "exec-key", "tiny")
    argv = harness.argv(endpoint)
    assert argv[3] == "claude" and "-p" in argv[2]
    assert argv[4:] == ["--output-format", "json", "--model", "tiny", "--dangerously-skip-permissions",
                        "--max-turns", "30"]
    env = {**endpoint_env(endpoint), **harness.env()}
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"  # the SDK appends /v1/messages itself
    assert env["ANTHROPIC_API_KEY"] == "exec-key"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["DISABLE_AUTOUPDATER"] == "1"
    assert env["CLAUDE_CONFIG_DIR"].startswith("/tmp/")  # never in the scored workspace


def test_mini_swe_agent_command_line_and_environment():
    harness = MiniSweAgentHarness()
    argv = harness.argv(ModelEndpoint("http://127.0.0.1:8123/v1", "exec-key", "tiny"))
    assert argv[3] == "mini" and "-t" in argv[2]
    assert argv[4:] == ["--model", "openai/tiny", "-y", "--exit-immediately"]
    env = harness.env()
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["MSWEA_GLOBAL_CONFIG_DIR"].startswith("/tmp/")


@needs_bwrap
@pytest.mark.slow
@pytest.mark.skipif(find_claude() is None, reason="the claude CLI is not installed (npm i -g @anthropic-ai/claude-code)")
def test_claude_code_live_against_the_proxy(tmp_path, tiny_tokenizer):
    from gyre.harnesses.claude_code import claude_install_dirs

    sessions, server = _proxy(tiny_tokenizer, ["Done."] * 8)
    key = sessions.mint("exec-cc")
    query = _query(tmp_path)
    sandbox = LocalSandbox.create(query, tmp_path / "ws", isolation="bwrap", extra_ro=claude_install_dirs(find_claude()))
    try:
        outcome = ClaudeCodeHarness(max_turns=2).run(
            query, sandbox, ModelEndpoint(server.base_url, key, "tiny"), time.monotonic() + 120)
    finally:
        sandbox.close()
        server.stop()
    calls = sessions.close("exec-cc").calls
    assert outcome.status is ExecutionStatus.completed, outcome.error
    assert calls and all(c.kind == "messages" for c in calls)


@needs_bwrap
@pytest.mark.slow
@pytest.mark.skipif(find_claude() is None, reason="the claude CLI is not installed (npm i -g @anthropic-ai/claude-code)")
def test_claude_code_runs_a_tool_call_through_the_proxy_and_comes_back_with_its_result(tmp_path, tiny_tokenizer):
    """The real CLI, two calls: the model (scripted) writes a file with Claude Code's Write tool in
    the Qwen tool-call format; Claude Code runs it in the sandbox and sends the result back; the
    second call's prompt extends the first's token ids (the proxy kept them, TITO), and both
    calls are recorded under the execution."""
    from gyre.harnesses.claude_code import claude_install_dirs

    query = _query(tmp_path)
    sandbox = LocalSandbox.create(query, tmp_path / "ws", isolation="bwrap", extra_ro=claude_install_dirs(find_claude()))
    target = f"{sandbox.workdir}/hello.py"
    write = ('<tool_call>\n{"name": "Write", "arguments": {"file_path": "%s", "content": "print(\\"hi\\")\\n"}}\n'
             '</tool_call>' % target)
    engine = ScriptedEngine(tiny_tokenizer, [write, "Wrote hello.py."])
    sessions = SessionRegistry()
    app = create_app(EngineRouter([engine]), sessions, tiny_tokenizer, model_name="tiny",
                     stop_token_ids=stop_token_ids(tiny_tokenizer), parser=parser_for("qwen"))
    server = ServerThread(app).start()
    key = sessions.mint("exec-cc-tool")
    try:
        outcome = ClaudeCodeHarness(max_turns=4).run(
            query, sandbox, ModelEndpoint(server.base_url, key, "tiny"), time.monotonic() + 180)
        written = (sandbox.workspace / "hello.py").read_text() if (sandbox.workspace / "hello.py").exists() else None
    finally:
        sandbox.close()
        server.stop()
    calls = sessions.close("exec-cc-tool").calls
    assert outcome.status is ExecutionStatus.completed, outcome.error
    assert written == 'print("hi")\n'
    assert len(calls) == 2 and all(c.kind == "messages" for c in calls), [c.kind for c in calls]
    first, second = engine.prompts
    assert len(second) > len(first) and second[:len(first)] == first  # the tool result appended to what was sent
