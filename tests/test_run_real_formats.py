"""`gyre run` on real-format task directories (NL2RepoBench, Terminal-Bench): one step lands scored executions."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from gyre.sandboxes.local.isolation import probe_bwrap
from tests.test_benchmarks_formats import write_terminal_bench
from tests.test_run_e2e import _config, _gyre

FIXTURES = Path(__file__).parent / "fixtures" / "realformats"


@pytest.mark.slow
@pytest.mark.skipif(probe_bwrap() is None, reason="Terminal-Bench tasks expect /app: bubblewrap needed")
@pytest.mark.parametrize(("kind", "directory", "tasks"), [
    ("nl2repo", "nl2repo", ["mathkit", "textkit"]),
    ("terminal-bench", "terminal_bench", ["csv-rows"]),  # + a task whose run-tests.sh needs nothing from outside
])
def test_one_step_on_a_real_format_directory(tmp_path, tiny_model_dir, kind, directory, tasks):
    bench = tmp_path / "bench"
    for task in tasks:  # the good tasks only: a run loads strictly, never shrinking its set silently
        shutil.copytree(FIXTURES / directory / task, bench / task)
    if kind == "terminal-bench":
        write_terminal_bench(bench)
    config = _config(tmp_path, tmp_path / "cache",
                     f"model:\n  path: {tiny_model_dir}\nbenchmark:\n  kind: {kind}\n  path: {bench}\n")
    # csv-rows cannot be scored here (its run-tests.sh installs uv from astral.sh): run anyway, to see it dropped
    proc = _gyre("run", "--config", str(config), "--steps", "1", "--allow-unscorable", "run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    rows = con.execute("select query_id, eval_status, score, eval_detail from executions").fetchall()
    assert len(rows) == 4, rows
    scored = [r for r in rows if r[1] == "ok"]
    assert scored and all(r[2] is not None for r in scored), rows
    for query_id, status, score, detail in rows:
        if query_id == "csv-rows":  # its run-tests.sh installs from the network: unscorable, never a 0
            assert (status, score) == ("error", None) and "unscorable here" in detail, detail
        elif kind == "terminal-bench" and status == "ok":  # tested in the agent's own live session
            assert detail.startswith("in place"), detail
