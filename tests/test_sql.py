"""`gyre sql RUN_DIR QUERY`: the run file when it is free, the live copy while a run holds it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from typer.testing import CliRunner

from gyre.cli.main import app
from gyre.records import StepRecord, utc_now
from gyre.storage.live_export import LiveExport
from gyre.storage.store import RunStore

# A writer in another process, as a live run is: it holds the lock on gyre.duckdb.
WRITER = textwrap.dedent("""
    import sys, time
    from gyre.storage.live_export import LiveExport
    from gyre.storage.store import RunStore
    store = RunStore(sys.argv[1] + "/gyre.duckdb")
    store.query("insert into runs (run_id, name) values ('live', 'held')")
    LiveExport(store, sys.argv[1]).write()
    store.query("insert into runs (run_id, name) values ('later', 'not copied yet')")
    print("ready", flush=True)
    sys.stdin.read()
""")


def _step(step: int) -> StepRecord:
    return StepRecord(step=step, policy_version=step + 1, reward_mean=0.5, num_executions=4, num_dropped=0,
                      mean_staleness=0.0, logprob_abs_diff=None, loss=None, grad_norm=None, tokens_trained=0,
                      started_at=utc_now(), finished_at=utc_now())


def test_sql_reads_a_finished_run_as_a_table_or_json(tmp_path):
    store = RunStore(tmp_path / "gyre.duckdb")
    store.append_steps([_step(0), _step(1)])
    LiveExport(store, tmp_path).write()  # a copy exists, but the free run file wins
    store.close()
    runner = CliRunner()
    done = runner.invoke(app, ["sql", str(tmp_path), "select step, reward_mean from steps order by step", "--json"])
    assert done.exit_code == 0, done.output
    payload = json.loads(done.stdout)
    assert payload["source"].endswith("gyre.duckdb") and payload["age_s"] is None
    assert payload["columns"] == ["step", "reward_mean"] and payload["rows"] == [[0, 0.5], [1, 0.5]]
    shown = runner.invoke(app, ["sql", str(tmp_path), "select step, finished_at from steps"])
    assert shown.exit_code == 0 and "finished_at" in shown.stdout
    bad = runner.invoke(app, ["sql", str(tmp_path), "select nope from steps"])
    assert bad.exit_code == 2 and "nope" in bad.output
    missing = runner.invoke(app, ["sql", str(tmp_path / "none"), "select 1"])
    assert missing.exit_code == 2 and "not a run directory" in missing.output


def test_sql_reads_the_live_copy_while_a_run_holds_the_file(tmp_path):
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        done = CliRunner().invoke(app, ["sql", str(tmp_path), "select run_id from runs order by run_id", "--json"])
        assert done.exit_code == 0, done.output
        payload = json.loads(done.stdout)
        assert payload["source"].endswith("live.duckdb") and 0 <= payload["age_s"] < 600
        assert payload["rows"] == [["live"]]  # as of the copy: the later row is not in it yet
        shown = CliRunner().invoke(app, ["sql", str(tmp_path), "select count(*) from runs"])
        assert shown.exit_code == 0 and "live run" in shown.output
    finally:
        writer.kill()
        writer.wait(timeout=60)
