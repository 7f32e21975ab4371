"""CLI commands as a user runs them: `gyre simulate`, `gyre bench`; JSON keys, tables, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gyre.cli.main import app

runner = CliRunner()


def test_simulate_json_has_the_headline_fields():
    result = runner.invoke(app, ["simulate", "--workload", "nl2repo-122b", "--policy", "elastic", "--steps", "12",
                                 "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("makespan_h", "mean_staleness", "lower_bound_h", "efficiency"):
        assert isinstance(data[key], float)
    assert abs(data["mean_staleness"] - 1.5) <= 0.1


def test_simulate_plot_writes_a_png(tmp_path):
    out = tmp_path / "gantt.png"
    result = runner.invoke(app, ["simulate", "--policy", "colocate", "--steps", "12", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert "makespan h" in result.output


def test_unknown_workload_and_policy_fail_cleanly():
    for args in (["--workload", "nope"], ["--policy", "nope"], ["--num-cells", "5"], ["--target-staleness", "9"]):
        result = runner.invoke(app, ["simulate", "--steps", "2", *args])
        assert result.exit_code == 2, (args, result.output)
        assert "error:" in result.output and "Traceback" not in result.output


def test_bench_trajectories_token_counts():
    result = runner.invoke(app, ["bench", "trajectories", "--no-fb", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    scale = data["scale_1m"]  # the measured execution is the xLong one it claims: ~1M unique tokens in ~1k calls
    assert 0.95e6 <= scale["tree_tokens"] <= 1.1e6 and scale["calls"] >= 500
    assert scale["tokens_tree"] <= scale["tokens_naive"] <= scale["tree_tokens"] < scale["tokens_per_call"]
    assert data["tokens_per_call"] >= 3 * data["tokens_tree"]
    assert data["tokens_naive"] > data["tokens_tree"]


def test_bench_rollout_reports_single_and_concurrent_throughput(tiny_model_dir):
    result = runner.invoke(app, ["bench", "rollout", "--json", "--model", str(tiny_model_dir),
                                 "--concurrency", "4", "--new-tokens", "8"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    # every call sampled exactly --new-tokens (no stop token cut one short): tokens/s counts what it claims
    assert data["tokens_sampled"] == {"single": 8, "concurrent": 4 * 8}
    assert abs(data["speedup"] - data["tokens_per_s_4"] / data["tokens_per_s_1"]) < 0.02


def test_run_checks_its_run_directory_before_any_work(tmp_path, monkeypatch):
    """`--resume` on a directory without checkpoints, or a new run into a used one, is one line (exit 2)
    before the model or warm start is built: `preflight` is never reached."""
    from typer.testing import CliRunner

    from gyre.cli.main import app

    def no_work(*_args, **_kwargs):
        raise AssertionError("preflight ran before the run directory was checked")

    monkeypatch.setattr("gyre.runtime.resolve.preflight", no_work)
    monkeypatch.setattr("gyre.runtime.resolve.check_inputs", no_work)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    missing = CliRunner().invoke(app, ["run", "--resume", str(tmp_path / "none")])  # its config.yaml is not read
    assert missing.exit_code == 2 and f"{tmp_path / 'none'}: no such directory" in " ".join(missing.output.split())
    (tmp_path / "empty").mkdir()
    empty = CliRunner().invoke(app, ["run", "--resume", str(tmp_path / "empty")])
    assert empty.exit_code == 2 and "holds no run (no gyre.duckdb)" in " ".join(empty.output.split()), empty.output
    import duckdb

    duckdb.connect(str(tmp_path / "empty" / "gyre.duckdb")).execute(
        "create table steps as select 0 as step union all select 1").close()
    no_checkpoint = CliRunner().invoke(app, ["run", "--resume", str(tmp_path / "empty")])
    said = " ".join(no_checkpoint.output.split())
    assert no_checkpoint.exit_code == 2 and "recorded 2 step(s) but holds no checkpoint" in said, said
    no_dir = CliRunner().invoke(app, ["run", "-c", "configs/tiny-cpu.yaml", "--resume"])
    assert no_dir.exit_code == 2 and "--resume needs RUN_DIR" in " ".join(no_dir.output.split()), no_dir.output
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "gyre.duckdb").write_bytes(b"")
    used = CliRunner().invoke(app, ["run", "--config", "configs/tiny-cpu.yaml", str(tmp_path / "used")])
    assert used.exit_code == 2 and "already holds a run" in " ".join(used.output.split()), used.output
    old_name = CliRunner().invoke(app, ["run", "-c", "configs/tiny-cpu.yaml", "--run-dir", str(tmp_path / "used")])
    assert old_name.exit_code == 2 and "already holds a run" in " ".join(old_name.output.split()), old_name.output
    both = CliRunner().invoke(app, ["run", str(tmp_path / "a"), "--run-dir", str(tmp_path / "b")])
    assert both.exit_code == 2 and "two run directories given" in " ".join(both.output.split()), both.output


def test_every_command_names_its_run_directory_run_dir():
    """One name for the run directory: the argument RUN_DIR in every command that takes one."""
    import typer.main

    from gyre.cli.main import app

    group = typer.main.get_command(app)
    for name in ("run", "report", "rerun-failed", "sql", "resume"):
        command = group.commands[name]
        arguments = [(p.metavar or p.name.upper()) for p in command.params
                     if p.param_type_name == "argument"]
        assert "RUN_DIR" in arguments, (name, arguments)
        assert not any("--run-dir" in p.opts for p in command.params if not getattr(p, "hidden", False)), name


def test_off_a_terminal_the_step_table_keeps_every_column(monkeypatch, tmp_path):
    """Written to a file or a CI log, rich would cut the table to 80 columns (`0.…`)."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    import gyre.cli.run as run_cli

    buf = io.StringIO()
    monkeypatch.setattr(run_cli, "console", Console(file=buf))
    record = SimpleNamespace(step=0, policy_version=1, eval_pass_rate=0.109375, reward_mean=0.125, num_dropped=0,
                             num_tampering=0, logprob_abs_diff=6.86e-09, token_cap_frac=0.0, clip_low_frac=0.0,
                             clip_high_frac=0.0, sampled_entropy=0.01, mean_response_tokens=66.0, loss=0.0,
                             grad_norm=0.046, tokens_trained=2097)
    run_cli._print_steps([record], tmp_path / "run")
    text = buf.getvalue()
    assert "…" not in text, text
    for shown in ("clip lo/hi", "grad norm", "0.109", "0.125", "6.86e-09", "2097"):
        assert shown in text, shown
    buf.truncate(0)
    buf.seek(0)
    run_cli._print_gspo_summary([record])  # its one line stays one line (a log wrapped it mid-figure at 80)
    assert buf.getvalue().count("\n") == 1 and len(buf.getvalue()) > 200, buf.getvalue()


def test_proxy_serve_on_a_port_in_use_is_one_line_before_any_model_loads(tmp_path):
    import socket

    from gyre.cli.main import app

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "proxy.yaml"
        config.write_text(f"host: 127.0.0.1\nport: {port}\ncache_dir: {tmp_path / 'cache'}\nmodel:\n  path: null\n"
                          f"engines:\n  - id: torch-0\nrecord_path: {tmp_path / 'calls.duckdb'}\n")
        result = runner.invoke(app, ["proxy", "serve", "-c", str(config)])
    assert result.exit_code == 2, result.output
    assert f"127.0.0.1:{port} cannot be served" in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not (tmp_path / "cache").exists() and not (tmp_path / "calls.duckdb").exists()  # no model, no file


def test_a_resumed_run_progress_bar_starts_at_its_first_step():
    from types import SimpleNamespace

    from rich.progress import Progress

    from gyre.cli.run_progress import RichProgress

    progress = Progress(disable=True)
    listener = RichProgress(progress, total_steps=4)
    listener(SimpleNamespace(kind="run_started", step=None, data={"steps": 4, "first_step": 2}))
    assert progress.tasks[listener.step_task].completed == 2


def test_a_resume_keeps_the_run_s_own_settings_unless_told_to_change_them(tmp_path, monkeypatch):
    """`--steps` is written with the run (its config.yaml): a resume asking for another count, or naming
    another config, stops before any work with what it would change; `--override` makes it the run's."""
    import duckdb

    from gyre.config.run import dump_config, load_config
    from gyre.runtime.run_dir import changed_settings

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-000001").mkdir(parents=True)
    duckdb.connect(str(run_dir / "gyre.duckdb")).execute("create table steps (step int)").close()
    own = load_config("configs/tiny-cpu.yaml").model_copy(update={"steps": 3})
    dump_config(own, run_dir / "config.yaml")
    assert changed_settings(run_dir, own) == []
    assert changed_settings(run_dir, own.model_copy(update={"steps": 5})) == ["steps: 3 -> 5"]

    def no_work(*_args, **_kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr("gyre.runtime.resolve.check_inputs", no_work)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    asked = CliRunner().invoke(app, ["run", "--resume", str(run_dir), "--steps", "5"])
    said = " ".join(asked.output.split())
    assert asked.exit_code == 2 and "would change steps: 3 -> 5" in said and "--override" in said, said
    other = CliRunner().invoke(app, ["run", "--resume", str(run_dir), "-c", "configs/tiny-cpu.yaml"])
    said = " ".join(other.output.split())
    assert other.exit_code == 2 and "steps: 3 -> 20" in said, said
    kept = CliRunner().invoke(app, ["run", "--resume", str(run_dir), "--steps", "3"])  # the same: no change
    assert isinstance(kept.exception, AssertionError), kept.output  # it went on, to the (stubbed) checks
    chosen = CliRunner().invoke(app, ["run", "--resume", str(run_dir), "--steps", "5", "--override"])
    assert "continues with steps: 3 -> 5" in " ".join(chosen.output.split()), chosen.output
    assert isinstance(chosen.exception, AssertionError), chosen.output


def test_off_a_terminal_run_tables_are_whole_rows(tmp_path, monkeypatch):
    """`gyre runs` and `gyre sql` into a file or a pipe: every cell whole (two runs once both read `.../dep-e…`)."""
    from datetime import datetime, timezone

    from gyre.storage.store import RunStore

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    for name in ("deployed-elastic-run-with-a-long-name-one", "deployed-elastic-run-with-a-long-name-two"):
        store = RunStore(tmp_path / name / "gyre.duckdb")
        store.append("runs", [{"run_id": name[-3:], "name": "t", "status": "stopped",
                               "status_reason": "stopped by a signal (Ctrl-C, SIGTERM): the current step abandoned, "
                               "every row recorded before it kept; `gyre run --resume RUN_DIR` continues",
                               "started_at": datetime(2026, 12, 2, tzinfo=timezone.utc)}])
        store.close()
    listed = runner.invoke(app, ["runs", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    assert "…" not in listed.output, listed.output
    for name in ("long-name-one", "long-name-two"):
        assert f"{tmp_path}/deployed-elastic-run-with-a-{name}" in listed.output, listed.output
    assert "`gyre run --resume RUN_DIR` continues" in listed.output
    queried = runner.invoke(app, ["sql", str(tmp_path / "deployed-elastic-run-with-a-long-name-one"),
                                  "select status_reason, status_reason as again from runs"])
    assert queried.exit_code == 0 and "…" not in queried.output, queried.output
    assert queried.output.count("`gyre run --resume RUN_DIR` continues") == 2, queried.output


def test_off_a_terminal_a_run_says_a_line_per_warm_start_tenth_step_and_eval_round():
    import io
    from types import SimpleNamespace

    from gyre.cli.run_progress import LineProgress

    out = io.StringIO()
    lines = LineProgress(out, total_steps=3)
    lines(SimpleNamespace(kind="warmstart_started", step=None, data={"steps": 100, "cache": "/c/tiny-warm-1"}))
    for step in range(100):
        lines(SimpleNamespace(kind="warmstart", step=step, data={"steps": 100, "loss": 1.0, "elapsed_s": step + 1.0}))
    lines(SimpleNamespace(kind="warmstart_finished", step=None, data={"steps": 100, "cache": "/c/tiny-warm-1",
                                                                       "seconds": 100.0}))
    t0, t1 = "2026-12-02T00:00:00+00:00", "2026-12-02T00:00:12.5+00:00"
    lines(SimpleNamespace(kind="eval_finished", step=0, data={"split": "in_distribution", "policy_version": 0,
                                                              "pass_rate": 0.375, "num_executions": 8,
                                                              "num_dropped": 1, "started_at": t0, "finished_at": t1}))
    lines(SimpleNamespace(kind="step_finished", step=0, data={"reward_mean": 0.25, "num_dropped": 2,
                                                              "num_executions": 8, "mean_staleness": 0.5,
                                                              "skipped_reason": None, "started_at": t0,
                                                              "finished_at": t1}))
    said = [line.split(" ", 1)[1] for line in out.getvalue().splitlines()]
    assert said[0].startswith("warm start: 100 supervised steps, once: cached as /c/tiny-warm-1"), said
    tenths = [line for line in said if line.startswith("warm start: ") and "%)" in line]
    assert len(tenths) == 10 and tenths[0].startswith("warm start: 10/100 (10%), loss 1.0000, 10 s elapsed, "
                                                      "about 1 min 30 s left"), tenths
    assert said[11] == ("warm start: done in 1 min 40 s; cached as /c/tiny-warm-1: later runs reuse it (keep "
                        "cache_dir; delete that directory to build it again)")
    assert said[12] == ("eval after 0/3 steps (in_distribution, policy v0): pass rate 0.375 over 8 executions, "
                        "1 dropped, 12.5 s")
    assert said[13] == "step 1/3: reward 0.250, eval 0.375, dropped 2/8, E[d] 0.50, 12.5 s"


def test_a_run_this_machine_cannot_score_stops_before_any_model_with_its_reason(tmp_path, monkeypatch):
    config = tmp_path / "tb.yaml"
    config.write_text(Path("configs/terminalbench-cpu.yaml").read_text().replace(
        "cache_dir: .gyre-cache", f"cache_dir: {tmp_path / 'cache'}"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    result = CliRunner().invoke(app, ["run", "-c", str(config), str(tmp_path / "run")])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "2 of 2 queries cannot be scored here" in said, said
    assert "csv-rows needs package-index, uv-installer" in said and "--allow-unscorable" in said, said
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()
    assert not (tmp_path / "cache" / "models").exists()


def test_help_reads_whole_sentences_and_flags_take_no_value():
    """`gyre --help` lists each command by its first paragraph: one line of text, never broken mid-sentence by the
    docstring's own line breaks; a boolean flag is shown as taking no value (typer's `--resume <bool>`)."""
    import typer.main

    group = typer.main.get_command(app)
    for name in ("run", "runs", "resume", "rerun-failed", "sql"):
        first = group.commands[name].help.strip().split("\n\n")[0]
        assert "\n" not in first and first.endswith("."), (name, first)
    shown = runner.invoke(app, ["run", "--help"], terminal_width=200)
    assert shown.exit_code == 0 and "--resume" in shown.output and "<bool>" not in shown.output, shown.output
    assert "<path>" in shown.output  # options that take a value keep their type
