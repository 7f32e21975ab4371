"""`gyre benchmark check --control`: a task whose starting files the evaluator cannot score is named before
any run, with the evaluator's reason; a task that scores its starting files 0 is scorable.

Real evaluations (bubblewrap, pytest) of two hand-written NL2RepoBench projects: one whose test command
loads a pytest plugin nothing provides (as schedule-master's list makes one its pytest cannot load), one
plain. Reading the scripts (`environments.needs`) calls both scorable; only the control run tells them apart.
"""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from gyre.cli.main import app
from gyre.evaluators.control_check import control_verdicts
from gyre.sandboxes.local.isolation import probe_bwrap
from tests.test_evaluator_nl2repo import _calc_query

pytestmark = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable")

BROKEN = ["python -m pytest -q -p gyre_no_such_plugin tests"]


def _bench(tmp_path):
    good = _calc_query(tmp_path / "good")
    broken = _calc_query(tmp_path / "broken", commands=BROKEN)
    bench = tmp_path / "bench"
    for query in (good, broken):
        shutil.copytree(query.root, bench / ("calc" if query is good else "calc-broken"))
    return bench


def test_the_control_run_names_what_reading_the_scripts_cannot(tmp_path):
    good, broken = _calc_query(tmp_path / "good"), _calc_query(tmp_path / "broken", commands=BROKEN)
    seen = []
    verdicts = control_verdicts([good, broken], tmp_path / "control", on_done=seen.append)
    assert seen == verdicts
    assert (verdicts[0].status, verdicts[0].score, verdicts[0].unscorable) == ("ok", 0.0, False), verdicts[0]
    assert (verdicts[1].status, verdicts[1].score, verdicts[1].unscorable) == ("error", None, True), verdicts[1]
    assert "gyre_no_such_plugin" in verdicts[1].reason and "starting files" in verdicts[1].reason, verdicts[1].reason
    assert (tmp_path / "control" / "0001" / "eval" / "score.json").is_file()  # kept, to read why
    assert not (tmp_path / "control" / "0000" / "eval" / "env").exists()  # its environment is not


def test_check_lists_it_as_unscorable_only_with_control(tmp_path):
    bench = _bench(tmp_path)
    plain = CliRunner().invoke(app, ["benchmark", "check", str(bench), "--json"])
    assert plain.exit_code == 0, plain.output
    assert json.loads(plain.stdout)["unscorable_here"] == []  # its scripts ask for nothing missing here
    done = CliRunner().invoke(app, ["benchmark", "check", str(bench), "--json", "--control",
                                    "--control-dir", str(tmp_path / "kept")])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    (row,) = report["unscorable_here"]
    assert row["id"] == "calc-broken" and row["needs"][0].startswith("an evaluation its starting files do not break")
    assert {v["query_id"]: v["status"] for v in report["control"]["verdicts"]} == {"calc": "ok", "calc-broken": "error"}
    again = CliRunner().invoke(app, ["benchmark", "check", str(bench), "--control", "--control-dir",
                                     str(tmp_path / "kept")])
    assert again.exit_code == 2 and "already exists" in " ".join(again.output.split())  # never mixed with old files
