"""`gyre report`: a run file written by the run store becomes plots, one self-contained page
and a summary; older files and empty tables give "no data", a bad directory a clear error."""

from __future__ import annotations

import base64
import hashlib
import struct
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from gyre.cli.main import app
from gyre.records import EvalRecord, EvalStatus, Execution, ExecutionStatus, Score, StepRecord, utc_now
from gyre.report import RunDirError, write_report
from gyre.report.data import load_run
from gyre.report.plots import PLOTS
from gyre.report.summary import summary_rows
from gyre.storage.store import RunStore

NUM_STEPS = 6
PLOT_NAMES = [name for name, *_ in PLOTS]


def _execution(i: int, step: int, purpose: str, staleness: int, verdict: str) -> tuple:
    ex = Execution(execution_id=f"{purpose}-{step}-{i}", step=step, query_id=f"q{i % 2}", benchmark="tiny",
                   group_index=i, purpose=purpose, status=ExecutionStatus.completed, workspace=Path(f"/w/{i}"),
                   policy_version_dispatched=max(0, step - staleness), num_calls=3, num_tokens=120)
    if verdict == "error":
        score = Score(execution_id=ex.execution_id, status=EvalStatus.error, detail="sandbox did not start")
    elif verdict == "tampering":
        score = Score(execution_id=ex.execution_id, status=EvalStatus.tampering, score=0.0,
                      evidence=["canary passed"], flags=["conftest.py patches the runner"])
    elif verdict == "flagged":
        score = Score(execution_id=ex.execution_id, status=EvalStatus.ok, score=0.5, flags=["sitecustomize.py"])
    else:
        score = Score(execution_id=ex.execution_id, status=EvalStatus.ok, score=(i % 3) / 2)
    return ex, score, staleness, 0.1 if purpose == "train" else None


def _write_run(run_dir: Path) -> Path:
    """A small cell-scheduler run through the store's own writers, the way the coordinator writes it."""
    store = RunStore(run_dir / "gyre.duckdb")
    t0 = utc_now()
    store.append("runs", [{"run_id": "abc123", "name": "tiny-test", "config_json": "{}", "started_at": t0}])
    steps, executions = [], []
    for step in range(NUM_STEPS):
        # step 2: one evaluator failure (dropped); step 4: one tampering and one flagged workspace
        verdicts = ["ok"] * 4
        if step == 2:
            verdicts[0] = "error"
        if step == 4:
            verdicts[:2] = ["tampering", "flagged"]
        stale = [0, 1, 1, 2]
        executions += [_execution(i, step, "train", stale[i], v) for i, v in enumerate(verdicts)]
        steps.append(StepRecord(
            step=step, policy_version=step + 1, reward_mean=0.2 + 0.05 * step, num_executions=4,
            num_dropped=verdicts.count("error"), num_tampering=verdicts.count("tampering"),
            mean_staleness=sum(stale) / 4, logprob_abs_diff=1e-3 * (step + 1), loss=0.01, grad_norm=0.3,
            tokens_trained=1000 + 10 * step, token_cap_frac=0.01 * step, clip_low_frac=0.1, clip_high_frac=0.05,
            sampled_entropy=1.5 - 0.1 * step, mean_response_tokens=40 + step,
            eval_pass_rate=0.3 if step % 3 == 0 else None,
            started_at=t0 + timedelta(seconds=10 * step), finished_at=t0 + timedelta(seconds=10 * step + 9)))
    for r in range(3):  # eval rounds before steps 0 and 3 and after the last, both held-out sets
        executions += [_execution(i, 3 * r, "eval", 0, "error" if (r, i) == (1, 0) else "ok") for i in range(2)]
    store.append_executions(executions)
    store.append_steps(steps)
    store.append_evals([
        EvalRecord(step=3 * r, policy_version=3 * r, split=split, pass_rate=base + 0.1 * r, num_executions=2,
                   num_dropped=0, started_at=t0, finished_at=t0 + timedelta(seconds=r))
        for r in range(3) for split, base in (("in_distribution", 0.3), ("generalisation", 0.1))
    ])
    # two cells: cell 1 switches to train at 4 s (1.5 s) and back to rollout at 9 s (0.5 s)
    segments = [(0, "train-busy", 0.0, 3.0), (0, "train-idle", 3.0, 12.0),
                (1, "rollout", 0.0, 4.0), (1, "switching", 4.0, 5.5), (1, "train-busy", 5.5, 9.0),
                (1, "switching", 9.0, 9.5), (1, "rollout", 9.5, 12.0)]
    store.append("cell_segments", [{"run_id": "abc123", "cell_id": c, "state": s, "start_s": a, "end_s": b}
                                   for c, s, a, b in segments])
    store.close()
    return run_dir


def _assert_png(path: Path) -> None:
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", path
    assert raw[12:16] == b"IHDR"
    width, height = struct.unpack(">II", raw[16:24])
    assert width >= 400 and height >= 200, (path, width, height)
    pixels = imread(path)  # decodes the whole image
    assert pixels.shape[:2] == (height, width)
    assert pixels.std() > 0.01, f"{path} is blank"


def test_report_writes_every_plot_and_one_self_contained_page(tmp_path):
    run_dir = _write_run(tmp_path / "run")
    report = write_report(run_dir)
    assert [p.name for p in report.plots] == PLOT_NAMES
    assert {p.name for p in report.plots if p.no_data} == set(), [(p.name, p.no_data) for p in report.plots]
    for plot in report.plots:
        assert plot.path == run_dir / "report" / f"{plot.name}.png"
        _assert_png(plot.path)
    page = (run_dir / "report" / "index.html").read_text()
    for plot in report.plots:
        assert "data:image/png;base64," + base64.b64encode(plot.path.read_bytes()).decode() in page
        assert f"<h2>{plot.title}</h2>" in page and f'alt="{plot.title}"' in page
    for title in ("Reward per step", "Eval pass rate per step", "Staleness E[d] per step", "Staleness histogram",
                  "Cell Gantt", "Role-switch times", "Tokens trained per step", "Drops and tampering per step",
                  "GSPO diagnostics per step"):
        assert title in page
    assert "<script" not in page and "<link" not in page and 'src="http' not in page and "url(" not in page
    assert "<th>evaluator failure rate</th>" in page and "abc123" in page
    assert sorted(p.name for p in (run_dir / "report").iterdir()) == sorted(
        [f"{n}.png" for n in PLOT_NAMES] + ["index.html"])


def test_the_data_and_summary_carry_the_runs_figures(tmp_path):
    run_dir = _write_run(tmp_path / "run")
    data = load_run(run_dir)
    assert data.run_ids == ("abc123",) and data.name == "tiny-test" and data.missing == frozenset()
    assert [s.step for s in data.steps] == list(range(NUM_STEPS))
    assert [(s.num_dropped, s.num_tampering, s.num_flagged) for s in data.steps][2:5] == [(1, 0, 0), (0, 0, 0),
                                                                                         (0, 1, 2)]
    assert data.steps[3].diagnostics["token_cap_frac"] == pytest.approx(0.03)
    assert data.splits == ["in_distribution", "generalisation"]
    assert sorted(data.staleness) == sorted([0, 1, 1, 2] * NUM_STEPS)
    switches = data.role_switches()
    assert [(s.cell_id, s.start_s, s.to_role) for s in switches] == [(1, 4.0, "train"), (1, 9.0, "rollout")]
    assert [s.duration_s for s in switches] == pytest.approx([1.5, 0.5])

    rows = dict(summary_rows(data))
    assert rows["run id"] == "abc123" and rows["config name"] == "tiny-test"
    assert rows["steps done"].startswith(f"{NUM_STEPS} (policy version {NUM_STEPS})")
    assert rows["eval pass rate (in_distribution)"].startswith("first 0.300 (step 0) -> last 0.500 (step 6)")
    assert rows["eval pass rate (generalisation)"].startswith("first 0.100 (step 0) -> last 0.300 (step 6)")
    assert "slope +0.0500 / step" in rows["reward trend"]
    assert rows["mean staleness E[d]"].startswith("1.000 over 24 train executions")
    assert rows["drops"].startswith("1 train executions dropped")
    # 2 evaluator failures (a train one, an eval one) of 30 evaluations
    assert rows["evaluator failure rate"].startswith("6.7% (2 of 30 evaluations: eval 1/6, train 1/24)")
    assert rows["tampering"].startswith("1 caught by the evaluator; 2 of 30 workspaces flagged")


def test_an_older_run_file_reads_as_no_data_not_as_an_error(tmp_path):
    """A file written before evals.split, GSPO's columns, num_tampering and cell_segments existed."""
    run_dir = _write_run(tmp_path / "run")
    with duckdb.connect(str(run_dir / "gyre.duckdb")) as con:  # no writer makes old files: drop what is new
        for column in ("token_cap_frac", "clip_low_frac", "clip_high_frac", "sampled_entropy",
                       "mean_response_tokens", "num_tampering"):
            con.execute(f"ALTER TABLE steps DROP COLUMN {column}")
        con.execute("ALTER TABLE evals DROP COLUMN split")
        con.execute("DELETE FROM evals WHERE step = 3")  # keep one row per round, as an old run had
        con.execute("DROP TABLE cell_segments")
    report = write_report(run_dir)
    assert {"evals.split", "steps.num_tampering", "cell_segments", "steps.token_cap_frac"} <= report.data.missing
    no_data = {p.name: p.no_data for p in report.plots if p.no_data}
    assert set(no_data) == {"cells", "role_switches", "gspo"}
    assert "table cell_segments is absent" in no_data["cells"]
    assert "column steps.token_cap_frac is absent" in no_data["gspo"]
    assert "logprob_abs_diff" not in no_data["gspo"]  # the one GSPO column old files have
    for plot in report.plots:
        _assert_png(plot.path)
    assert report.data.splits == ["in_distribution"]
    assert "absent from this run file" in dict(report.rows)
    assert "<b>No data</b>: table cell_segments is absent" in report.html_path.read_text()


def test_a_run_with_no_steps_yet_still_reports(tmp_path):
    store = RunStore(tmp_path / "run" / "gyre.duckdb")
    store.append("runs", [{"run_id": "r0", "name": "fresh", "config_json": "{}", "started_at": utc_now()}])
    store.close()
    report = write_report(tmp_path / "run")
    assert {p.name for p in report.plots if p.no_data} == set(PLOT_NAMES)
    for plot in report.plots:
        _assert_png(plot.path)
    rows = dict(report.rows)
    assert rows["steps done"] == "0" and rows["reward trend"] == "no step recorded a reward"


def test_the_run_file_is_opened_read_only_and_left_unchanged(tmp_path):
    run_dir = _write_run(tmp_path / "run")
    before = hashlib.sha256((run_dir / "gyre.duckdb").read_bytes()).hexdigest()
    # DuckDB refuses a second connection to one file with another configuration in one process,
    # so the report succeeding while a read-only one is open shows it opened the file read-only.
    with duckdb.connect(str(run_dir / "gyre.duckdb"), read_only=True):
        write_report(run_dir)
    assert hashlib.sha256((run_dir / "gyre.duckdb").read_bytes()).hexdigest() == before
    assert not (run_dir / "gyre.duckdb.wal").exists()


def test_cli_report_prints_the_summary_and_the_paths(tmp_path):
    run_dir = _write_run(tmp_path / "run")
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    for text in ("run id", "abc123", "evaluator failure rate", "tampering", "mean staleness E[d]",
                 f"wrote {run_dir / 'report' / 'index.html'}", str(run_dir / "report" / "gspo.png")):
        assert text in result.output, text


def test_cli_report_json_is_one_document_with_the_summary_and_the_files(tmp_path):
    import json

    run_dir = _write_run(tmp_path / "run")
    result = CliRunner().invoke(app, ["report", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    labels = {row["label"] for row in doc["summary"]}
    assert {"run id", "evaluator failure rate"} <= labels
    assert doc["html"] == str(run_dir / "report" / "index.html")
    assert str(run_dir / "report" / "gspo.png") in {p["path"] for p in doc["plots"]}


def test_cli_report_on_a_bad_directory_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    for path, message in ((tmp_path / "missing", "does not exist"), (tmp_path / "empty", "holds no gyre.duckdb")):
        result = CliRunner().invoke(app, ["report", str(path)])
        assert result.exit_code == 2, result.output
        flat = " ".join(result.output.split())
        assert "error:" in flat and message in flat and "Traceback" not in result.output
        assert not (path / "report").exists()
    with pytest.raises(RunDirError, match="holds no gyre.duckdb"):
        write_report(tmp_path / "empty")


def test_the_tables_doc_names_every_table_and_column_of_the_schema():
    from gyre.storage.store import SCHEMA

    doc = (Path(__file__).resolve().parents[1] / "docs" / "tables.md").read_text()
    for table, columns in SCHEMA.items():
        assert f"### `{table}`" in doc, table
        for column, _ in columns:
            assert f"`{column}`" in doc, f"{table}.{column}"


def test_a_live_run_is_reported_from_its_copy_and_not_rerun(tmp_path):
    """While a run's process holds gyre.duckdb, `gyre report` reads the copy the run refreshes after every
    step (live.duckdb) and says so; `gyre rerun-failed`, which must write the run file, says in one line why
    it cannot run yet. The holder is a real second process."""
    import shutil
    import subprocess
    import sys

    run_dir = _write_run(tmp_path / "run")
    (run_dir / "config.yaml").write_text("name: live\n")
    shutil.copy(run_dir / "gyre.duckdb", tmp_path / "snapshot.duckdb")  # what the run's live export writes
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, time\n"
                               f"con = duckdb.connect({str(run_dir / 'gyre.duckdb')!r})\n"
                               "print('held', flush=True)\ntime.sleep(120)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        early = CliRunner().invoke(app, ["report", str(run_dir)])
        assert early.exit_code == 2 and "has not written live.duckdb yet" in " ".join(early.output.split())
        shutil.copy(tmp_path / "snapshot.duckdb", run_dir / "live.duckdb")
        result = CliRunner().invoke(app, ["report", str(run_dir)])
        assert result.exit_code == 0, result.output
        assert "the run is live: read from its copy live.duckdb" in " ".join(result.output.split())
        assert "abc123" in result.output
        rerun = CliRunner().invoke(app, ["rerun-failed", str(run_dir)])
        flat = " ".join(rerun.output.split())
        assert rerun.exit_code == 2 and "is a live run" in flat and "Traceback" not in rerun.output, rerun.output
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_the_failure_rate_counts_each_execution_once_with_its_latest_verdict(tmp_path):
    """After `gyre rerun-failed` rescored the run's evaluator failures, the report counts the new attempts and
    says so; an eval execution a file holds twice (recorded before eval rounds were one transaction) is one."""
    from gyre.report.data import load_run
    from gyre.report.summary import summary_rows

    run_dir = _write_run(tmp_path / "run")
    before = dict(summary_rows(load_run(run_dir)))["evaluator failure rate"]
    assert before.startswith("6.7% (2 of 30 evaluations") and "rescored" not in before, before
    store = RunStore(run_dir / "gyre.duckdb")
    failed = [row[0] for row in store.query("select execution_id from executions where eval_status = 'error'")]
    store.append("eval_attempts", [{"execution_id": eid, "attempt": 2, "rerun_id": "r1", "eval_status": "ok",
                                    "score": 1.0, "flags": []} for eid in failed])
    store.query("insert into executions select * from executions where purpose = 'eval' limit 1")  # a duplicate
    store.close()
    after = dict(summary_rows(load_run(run_dir)))["evaluator failure rate"]
    assert after.startswith("0.0% (0 of 30 evaluations") and "2 rescored by gyre rerun-failed" in after, after
