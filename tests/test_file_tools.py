"""The harness's file tools as commands (`gyre.sandboxes.file_tools`), run here by a plain bash in a
directory: what a sandbox's `exec` would run inside it, byte for byte."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from gyre.sandboxes import file_tools
from gyre.sandboxes.base import ExecResult


def _bash_in(directory: Path, commands: list[str]):
    def exec_(command: str, timeout_s: float, stdin: bytes | None = None) -> ExecResult:
        commands.append(command)
        started = time.monotonic()
        done = subprocess.run(["bash", "-c", command], cwd=directory, input=stdin, capture_output=True,
                              timeout=timeout_s)
        return ExecResult(done.returncode, done.stdout.decode(), done.stderr.decode(), False,
                          time.monotonic() - started)
    return exec_


CONTENT = "".join(f"line {i}: 'quotes' \"and\" $(not run) `nor this` é ü 東京 \\n\n" for i in range(4000))


@pytest.mark.parametrize("stdin", [True, False])
def test_a_write_lands_byte_for_byte_in_one_command_or_in_chunks(tmp_path, stdin):
    commands: list[str] = []
    exec_ = _bash_in(tmp_path, commands)
    file_tools.write_file(exec_, "pkg/deep/mod.txt", CONTENT, stdin=stdin)
    assert (tmp_path / "pkg" / "deep" / "mod.txt").read_bytes() == CONTENT.encode("utf-8")
    size = len(CONTENT.encode("utf-8"))
    # on standard input one command; in the command line chunks that each fit an argument (128 KiB)
    assert len(commands) == (1 if stdin else -(-size // file_tools.CHUNK_BYTES)) and len(commands) > (0 if stdin else 1)
    assert all(len(c) < 128 * 1024 for c in commands)
    file_tools.write_file(exec_, "empty.txt", "", stdin=stdin)
    assert (tmp_path / "empty.txt").read_bytes() == b""
    assert file_tools.read_file(exec_, "pkg/deep/mod.txt", 10 * size) == CONTENT


def test_a_read_larger_than_a_commands_output_is_refused_not_cut(tmp_path):
    (tmp_path / "big.txt").write_text("x" * 5000)
    with pytest.raises(ValueError, match="5000 bytes, more than a command may print"):
        file_tools.read_file(_bash_in(tmp_path, []), "big.txt", 4096)
    with pytest.raises(OSError, match="cannot read missing.txt"):
        file_tools.read_file(_bash_in(tmp_path, []), "missing.txt", 4096)


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "../x", "a/../../x", "nul\0byte"])
def test_paths_outside_the_workspace_are_refused_before_any_command(tmp_path, bad):
    commands: list[str] = []
    with pytest.raises(ValueError, match="relative to the workspace"):
        file_tools.write_file(_bash_in(tmp_path, commands), bad, "x", stdin=True)
    with pytest.raises(ValueError, match="relative to the workspace"):
        file_tools.read_file(_bash_in(tmp_path, commands), bad, 100)
    assert commands == []
