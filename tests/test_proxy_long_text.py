"""Long texts are tokenised in a helper process: the same ids, and no helper outlives its proxy.

`gyre/proxy/long_text.py` moves the tokenising of texts of `LONG_TEXT_CHARS` or more out of
the proxy's process. The ids must be exactly the in-process tokenizer's (with control-token
parsing and without); a helper that dies is replaced for the call that finds it dead; a
helper whose proxy was killed outright exits on its own.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from tokenizers import Tokenizer

from gyre.proxy.long_text import LONG_TEXT_CHARS, PARENT_CHECK_S, LongTextTokenizer
from tests.serve_process import REPO

GONE_WITHIN_S = 60 * PARENT_CHECK_S
"""Generous: at load average 10 a nice 19 process may wait long for a core."""


def _text(seed: int) -> str:
    rng = random.Random(seed)
    parts = ["ab", " cd", "<|im_end|>", "\n", " é", "<tool_call>", "xyz "]
    return "".join(rng.choice(parts) for _ in range(LONG_TEXT_CHARS // 3))


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    status = Path(f"/proc/{pid}/status")
    try:
        state = next(line for line in status.read_text().splitlines() if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, its status was read
        return False
    return "Z" not in state.split()[1]


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_WITHIN_S
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_same_ids_as_in_process_and_a_dead_helper_is_replaced(tiny_tokenizer):
    definition = tiny_tokenizer._tokenizer.to_str()
    special, plain = Tokenizer.from_str(definition), Tokenizer.from_str(definition)
    plain.encode_special_tokens = True
    text = _text(0)
    assert len(text) >= LONG_TEXT_CHARS
    helper = LongTextTokenizer(definition)
    started: list[int] = []
    try:
        assert helper.encode(text, True) == special.encode(text, add_special_tokens=False).ids
        started += list(helper._pool._processes)  # the pool's worker pids (to kill one, and clean up)
        (pid,) = started
        os.kill(pid, signal.SIGKILL)
        assert _wait_gone(pid)
        assert helper.encode(text, False) == plain.encode(text, add_special_tokens=False).ids  # a new helper
        started += list(helper._pool._processes)
        assert started[-1] != pid
    finally:
        _kill(started)


def test_a_helper_exits_once_its_proxy_is_killed(tmp_path):
    script = (
        "from gyre.benches.proxy import _tokenizer\n"
        "from gyre.proxy.long_text import LongTextTokenizer\n"
        "from tests.test_proxy_long_text import _text\n"
        "helper = LongTextTokenizer(_tokenizer()._tokenizer.to_str())\n"
        "helper.encode(_text(1), True)\n"
        "print(*helper._pool._processes, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    proxy = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    helpers: list[int] = []
    try:
        helpers = [int(pid) for pid in proxy.stdout.readline().split()]
        assert helpers, "the stand-in proxy started no helper"
        os.kill(proxy.pid, signal.SIGKILL)
        proxy.wait(timeout=30)
        assert all(_wait_gone(pid) for pid in helpers), "a helper outlived its proxy"
    finally:
        _kill([proxy.pid] if proxy.poll() is None else [])
        proxy.wait(timeout=30)
        _kill(helpers)
