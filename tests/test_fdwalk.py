"""Reading a tree the agent can still change, as root, without following a link (`sandboxes.fdwalk`)."""

from __future__ import annotations

import os

from gyre.sandboxes.fdwalk import read_regular


def test_read_regular_reads_a_plain_file_and_nothing_else(tmp_path):
    (tmp_path / "tests" / "resources").mkdir(parents=True)
    (tmp_path / "tests" / "resources" / "expected.txt").write_text("42\n")
    assert read_regular(tmp_path, "tests/resources/expected.txt", 1024) == b"42\n"
    assert read_regular(tmp_path, "tests/resources/expected.txt", 2) is None  # over the limit
    assert read_regular(tmp_path, "tests/resources/missing.txt", 1024) is None
    assert read_regular(tmp_path, "../etc/passwd", 1024) is None


def test_read_regular_never_follows_a_link_or_opens_a_fifo(tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text("host\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "tests").symlink_to(host)  # a directory on the way swapped for a link
    assert read_regular(repo, "tests/secret.txt", 1024) is None
    (repo / "file.txt").symlink_to(host / "secret.txt")
    assert read_regular(repo, "file.txt", 1024) is None
    os.mkfifo(repo / "pipe")  # opening it for reading would block: it is never opened
    assert read_regular(repo, "pipe", 1024) is None
    (repo / "dir").mkdir()
    assert read_regular(repo, "dir", 1024) is None
