"""What a task's test scripts need, read from real script shapes (Terminal-Bench, Harbor, NL2RepoBench)."""

from __future__ import annotations

import pytest

from gyre.evaluators.environments.needs import Available, script_needs, task_needs, unmet
from gyre.records import Query

TB_RUN_TESTS = """#!/bin/bash
# Install curl
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
source $HOME/.local/bin/env
uv venv .tbench-testing
source .tbench-testing/bin/activate
uv pip install pytest==8.4.1
uv run pytest $TEST_DIR/test_outputs.py -rA
"""
HARBOR_TEST_SH = """#!/bin/bash
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh
source $HOME/.local/bin/env
uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def test_terminal_bench_standard_script():
    """Its apt lines only fetch curl for uv's installer: the installer is the need (met in a task's container
    with the index, `uv_installer`), not apt or astral.sh."""
    assert script_needs(TB_RUN_TESTS) == {"uv-installer:0.7.13", "uv", "package-index"}
    assert unmet(sorted(script_needs(TB_RUN_TESTS)), Available(package_index=True, uv_installer=True)) == []
    assert unmet(sorted(script_needs(TB_RUN_TESTS)), Available(package_index=True)) == ["uv", "uv-installer:0.7.13"]


def test_harbor_standard_script():
    assert script_needs(HARBOR_TEST_SH) == {"uv-installer:0.9.7", "uv", "python:3.13", "package-index"}


def test_apt_or_a_fetch_beyond_the_installer_stays_a_need():
    assert "apt" in script_needs(TB_RUN_TESTS.replace("install -y curl", "install -y curl gcc"))
    assert "apt" in script_needs(TB_RUN_TESTS.replace("apt-get update", "apt-get update && apt-get upgrade -y"))
    other = script_needs(TB_RUN_TESTS + "curl -fsSL https://example.com/data.csv -o data.csv\n")
    assert {"apt", "network:example.com", "uv-installer:0.7.13"} <= other
    unpinned = script_needs(TB_RUN_TESTS.replace("uv/0.7.13/install.sh", "uv/install.sh"))
    assert {"apt", "network:astral.sh"} <= unpinned and not any(n.startswith("uv-installer") for n in unpinned)


def test_local_only_commands_need_nothing():
    for text in ("pip install -e .", "touch README.md && pip install -e .", "python -m pytest -q tests",
                 "echo setup done", "python install.py", "cd /app\npython -m pytest $TEST_DIR/test_outputs.py -rA\n",
                 "# apt-get install -y curl (a comment)\npytest"):
        assert script_needs(text) == set(), text
    assert script_needs("pip install requests") == {"package-index"}
    assert script_needs("pip install -r requirements.txt") == {"package-index"}


def test_unmet_against_what_is_available():
    needs = ["apt", "network:astral.sh", "package-index", "python:3.13", "uv"]
    assert unmet(needs, Available(python="3.11")) == needs
    assert unmet(needs, Available(python="3.11", uv_installer=True)) == needs  # uv from no installer
    assert unmet(needs, Available(python="3.13", uv=True, package_index=True,
                                  network_hosts=frozenset({"astral.sh"}))) == ["apt"]


def test_task_needs_reads_the_scripts_a_command_runs(tmp_path):
    root = tmp_path / "task"
    (root / "tests").mkdir(parents=True)
    (root / "run-tests.sh").write_text(TB_RUN_TESTS)
    (root / "tests" / "test.sh").write_text(HARBOR_TEST_SH)
    tb = Query(query_id="t", benchmark="tb", instruction="x", root=root, hidden_tests_dir=root / "tests",
               test_files=[], test_commands=["bash run-tests.sh"], test_case_count=1)
    assert "uv-installer:0.7.13" in task_needs(tb) and "python:3.13" not in task_needs(tb)
    harbor = tb.model_copy(update={"test_commands": ["bash /tests/test.sh"]})
    assert "python:3.13" in task_needs(harbor)


def test_task_needs_reads_the_scripts_a_script_sources(tmp_path):
    """42 of the 94 published Terminal-Bench tasks surveyed run `source $TEST_DIR/setup-uv-pytest.sh` from
    run-tests.sh: what that script needs is the task's need (it was missed: `check` called them scorable)."""
    root = tmp_path / "task"
    (root / "tests").mkdir(parents=True)
    (root / "run-tests.sh").write_text("#!/bin/bash\nsource $TEST_DIR/setup-uv-pytest.sh\n"
                                       "bash $TEST_DIR/run-uv-pytest.sh\n")
    (root / "tests" / "setup-uv-pytest.sh").write_text(TB_RUN_TESTS.replace("gcc", "").split("uv venv")[0]
                                                       + "uv init\nuv add pytest==8.4.1\n")
    (root / "tests" / "run-uv-pytest.sh").write_text("uv run pytest $TEST_DIR/test_outputs.py -rA\n")
    tb = Query(query_id="t", benchmark="tb", instruction="x", root=root, hidden_tests_dir=root / "tests",
               test_files=[], test_commands=["bash /tests/run-tests.sh"], test_case_count=1)
    assert task_needs(tb) == ["package-index", "uv", "uv-installer:0.7.13"]


def test_a_task_needing_the_network_is_unscorable_here_never_zero(tmp_path):
    from gyre.benchmarks import load_benchmark
    from gyre.evaluators import evaluate_query
    from gyre.records import EvalStatus
    from tests.test_benchmarks_formats import write_harbor

    task = write_harbor(tmp_path / "hb", test_sh=HARBOR_TEST_SH)
    (query,) = load_benchmark("harbor", task.parent)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    score = evaluate_query(query, workspace, tmp_path / "eval", "x")
    assert (score.status, score.score) == (EvalStatus.error, None)
    assert "unscorable here" in score.detail and "uv-installer:0.9.7" in score.detail and "python:3.13" in score.detail


def test_preflight_names_the_unscorable_queries(tmp_path, caplog):
    from gyre.config.run import RunConfig
    from gyre.runtime.resolve import warn_unscorable

    root = tmp_path / "task"
    root.mkdir()
    (root / "run-tests.sh").write_text(TB_RUN_TESTS)
    needy = Query(query_id="needy", benchmark="tb", instruction="x", root=root, hidden_tests_dir=root,
                  test_files=[], test_commands=["bash run-tests.sh"], test_case_count=1)
    local = needy.model_copy(update={"query_id": "local", "test_commands": ["python -m pytest -q tests"]})
    with caplog.at_level("WARNING", logger="gyre.runtime.resolve"):
        found = warn_unscorable([needy, local], RunConfig())
    assert [qid for qid, _ in found] == ["needy"]
    assert "1 of 2 queries cannot be scored here" in caplog.text and "uv-installer:0.7.13" in caplog.text


def test_check_and_preflight_meet_the_installer_in_a_tasks_container(tmp_path):
    """A Terminal-Bench task with the boilerplate runner: unscorable in the local sandbox (astral.sh is not
    reachable), scorable in its own container with the index, where uv from the index stands in."""
    import json

    from typer.testing import CliRunner

    from gyre.benchmarks import load_benchmark
    from gyre.cli.main import app
    from gyre.config.run import RunConfig
    from gyre.runtime.resolve import warn_unscorable

    task = tmp_path / "tb" / "boiler"
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text("instruction: do it\n")
    (task / "run-tests.sh").write_text(TB_RUN_TESTS)
    (task / "tests" / "test_outputs.py").write_text("def test_x():\n    assert True\n")

    def unscorable(*flags):
        result = CliRunner().invoke(app, ["benchmark", "check", str(task.parent), "--json", *flags])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["unscorable_here"]

    (local,) = unscorable("--network", "package-index")  # (uv itself is met where gyre's tools hold it)
    assert local["id"] == "boiler" and "uv-installer:0.7.13" in local["needs"]
    assert unscorable("--network", "package-index", "--sandbox", "docker") == []
    assert unscorable("--sandbox", "docker")[0]["needs"] == ["package-index", "uv-installer:0.7.13"]
    queries = load_benchmark("terminal-bench", task.parent)
    docker = RunConfig.model_validate({"sandbox": {"type": "docker"}, "evaluator": {"network": "package-index"}})
    assert warn_unscorable(queries, docker) == []


JUDGE_TEST = """\
import requests


def test_the_judge_accepts_the_answer():
    answer = open("/app/answer.txt").read()
    assert requests.post("https://judge.example.invalid/check", data=answer, timeout=10).json()["ok"]


def test_a_local_server():
    assert requests.get("http://127.0.0.1:8000/health", timeout=5).ok
"""


def test_a_test_that_asks_a_remote_judge_is_unscorable_here_never_zero(tmp_path):
    """Needs are read from the hidden Python tests too: a remote host named beside a network client."""
    from gyre.benchmarks import load_benchmark
    from gyre.evaluators import evaluate_query
    from gyre.records import EvalStatus
    from tests.test_benchmarks_formats import write_harbor

    test_sh = "#!/bin/bash\npython -m pytest /tests/test_outputs.py -rA && echo 1 > /logs/verifier/reward.txt " \
              "|| echo 0 > /logs/verifier/reward.txt\n"
    task = write_harbor(tmp_path / "hb", test_sh=test_sh)
    (task / "tests" / "test_outputs.py").write_text(JUDGE_TEST)
    (query,) = load_benchmark("harbor", task.parent)
    assert "network:judge.example.invalid" in task_needs(query)
    assert not any("127.0.0.1" in need for need in task_needs(query))  # the task's own server
    workspace = tmp_path / "ws"
    workspace.mkdir()
    score = evaluate_query(query, workspace, tmp_path / "eval", "x")
    assert (score.status, score.score) == (EvalStatus.error, None)
    assert "unscorable here" in score.detail and "network:judge.example.invalid" in score.detail


PYQUERY_SHAPED = '''\
# Copyright (C) 2008 - the authors
# Licensed under the Apache License, Version 2.0: http://www.apache.org/licenses/LICENSE-2.0
from lxml import etree
from webtest import http

from pyquery import PyQuery as pq

NAMESPACED = """<foo xmlns:bar="http://example.com/bar"><html xmlns="http://www.w3.org/1999/xhtml"/></foo>"""


def test_custom_opener():
    def opener(url):
        return '<html><body><div class="node"></div>'

    assert len(pq(url="http://example.com", opener=opener)(".node")) == 1


def test_namespaces():
    assert pq(NAMESPACED, namespaces={"bar": "http://example.com/bar"})("bar|blah")


def test_session():
    import requests
    server = http.StopableWSGIServer.create(lambda environ, start: [b""])
    assert pq(url=server.application_url, session=requests.Session())
'''


@pytest.mark.parametrize(("source", "hosts"), [
    # pyquery 2.0.1's tests/test_pyquery.py, its shapes (written here): a licence URL in a comment, XML namespaces,
    # a URL its own opener answers, `requests` imported for a session against a local server: nothing to fetch
    (PYQUERY_SHAPED, set()),
    (JUDGE_TEST, {"judge.example.invalid"}),  # posts to a remote judge: unscorable offline
    ("import requests\n\nBASE = 'https://api.example.org/v1'\n\n\ndef test_x():\n"
     "    assert requests.get(BASE + '/items', timeout=5).ok\n", {"api.example.org"}),  # through a name
    ("import pytest\nimport httpx\n\n\n@pytest.mark.parametrize('url', ['https://a.example.net/x'])\n"
     "def test_x(url):\n    assert httpx.get(url).status_code == 200\n", {"a.example.net"}),  # a parametrize list
    ("from unittest import mock\nimport requests\n\n\n@mock.patch('requests.get')\ndef test_x(get):\n"
     "    requests.get('https://remote.example.com')\n", set()),  # mocked
    ("import urllib.request\n\n\nclass Fake(urllib.request.BaseHandler):\n    def http_open(self, req):\n"
     "        return None\n\n\ndef test_x():\n    urllib.request.install_opener(urllib.request.build_opener(Fake))\n"
     "    urllib.request.urlopen('http://feeds.example.com/rss')\n", set()),  # an opener of its own
])
def test_network_needs_are_read_from_code_that_fetches(source, hosts):
    from gyre.evaluators.environments.fetched_urls import fetched_hosts

    assert fetched_hosts(source) == hosts


def test_a_task_whose_tests_only_name_urls_is_scorable(tmp_path):
    """A URL in a licence comment, an XML namespace or a request the test's own opener answers does not make the
    task unscorable (pyquery's tests scored nothing at all before: `network:www.w3.org`)."""
    from gyre.benchmarks.nl2repo import load_nl2repo

    task = tmp_path / "bench" / "pyquery"
    (task / "hidden_tests" / "tests").mkdir(parents=True)
    (task / "hidden_tests" / "tests" / "test_pyquery.py").write_text(PYQUERY_SHAPED)
    (task / "start.md").write_text("Write pyquery.\n")
    (task / "test_case_count.txt").write_text("3\n")
    (task / "test_commands.json").write_text('["pytest --continue-on-collection-errors tests"]')
    (task / "test_files.json").write_text('["tests"]')
    (query,) = load_nl2repo(task.parent)
    assert not any(need.startswith("network:") for need in task_needs(query))
