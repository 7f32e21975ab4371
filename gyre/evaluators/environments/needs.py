"""Can this machine score a task? What its test scripts need, read before anything runs.

Real Terminal-Bench and Harbor scripts install their own tools at test time (`curl ...
astral.sh/uv/install.sh | sh`, `apt-get install -y ...`, `uvx -p 3.13 pytest`), and
NL2RepoBench setup commands call pip. In the local sandbox such a step fails for reasons
that have nothing to do with the workspace, and a failed verifier often writes reward 0
itself: a false zero that would be trained on. So each task's scripts are read first
(`task_needs`: the command lines of `test_commands`, and the scripts they run from the
task's own directory, e.g. `run-tests.sh`, `tests/test.sh`) and every need is named:

- `apt`: apt-get / apt / dpkg installs (never available in the local sandbox). Not counted where
  the apt lines only update or install curl (and ca-certificates) and every fetch of the script is
  uv's installer (below): they only serve the installer, and fail harmlessly when it is provided;
- `uv-installer:<version>`: `curl ... https://astral.sh/uv/<version>/install.sh | sh` (Terminal-Bench's
  boilerplate). Met where the evaluation provides what the installer would leave: in a task's
  container with the package index, `uv==<version>` from the index into `$HOME/.local/bin` with the
  installer's `env` file (`uv_installer.py`); elsewhere unmet;
- `network:<host>`: a URL fetched with curl or wget (the sandbox has no network), or one a hidden
  Python test file's code passes to a fetching call of a network client (`requests.post(...)`: a
  test that asks a remote judge; `fetched_urls`: never a licence comment, an XML namespace, or a
  request the file's own opener or mock answers; loopback hosts are the task's own servers,
  `test_hosts`);
- `python:<X.Y>`: a specific interpreter asked of uv or pyenv, other than the one here;
- `uv`: uv / uvx, when the evaluation's tools do not include it (they do when gyre's `uv`
  dependency is installed: `available_here`);
- `package-index`: pip or uv installing named packages from an index, or an NL2RepoBench task
  whose image holds packages besides the project (`TaskSpec.image_packages`, from `start.md`):
  the evaluation installs them from the index before the task's commands, as the image has them;
- `program:<name>`: a program a test command starts (its first word, after `NAME=value`
  assignments, in each part between `&&`, `||`, `;`, `|`) that the evaluation's PATH lacks
  (`xvfb-run`). Read here, before anything runs: at run time a setup command's "command not
  found" cannot be told from a workspace script exiting 127 (`python install.py`), so it is
  the workspace's result there (only programs missing here are listed);
- `tool-clash:<distribution>`: an NL2RepoBench project named like one of the evaluation's
  own test tools (pytest, pip, setuptools and what they require: packaging, pygments, ...,
  `toolenv.tool_distributions`). Its hidden tests would import the tools' copy whenever the
  workspace lacks the project (an empty workspace scored 1.0 on `packaging`), and a workspace
  can always reach that copy (`/gyre-tools` is bound into every evaluation): never met here.

`task_plugins(query)` reads, from the same scripts, the pytest plugin distributions they install
(`pytest-json-ctrf`): gyre's plugin loads exactly those by name, autoloading staying off. The task's
scripts are the test commands, the task's own scripts they name, and those these name in turn
(`source $TEST_DIR/setup-uv-pytest.sh`), `_SCRIPT_DEPTH` levels deep.

`unmet(needs, available)` keeps the needs this evaluation cannot meet (`available_here` is
what an evaluation on this machine offers: the evaluator, the run's preflight and
`gyre benchmark check` all ask it); the evaluator turns
them into an evaluator failure with the reason ("unscorable here: needs apt"), never a 0,
and `gyre benchmark check` counts, per benchmark, the tasks it can score and why not the
others. This is a reading of shell text, not an interpreter: a need hidden behind a
variable or a downloaded script is missed (the run then fails as the workspace's result
only if pytest started; otherwise it is still an evaluator failure).
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath

from packaging.utils import canonicalize_name

from gyre.evaluators.environments.fetched_urls import fetched_hosts
from gyre.evaluators.environments.toolenv import tool_distributions, tools_have_uv, top_level_modules
from gyre.records import Query

APT = "apt"
UV = "uv"
UV_INSTALLER = "uv-installer"
PACKAGE_INDEX = "package-index"
TOOL_CLASH = "tool-clash"
PROGRAM = "program"
SHELL_WORDS = frozenset({
    "set", "cd", "export", "echo", "true", "false", "source", ".", "test", "[", "exit", "unset", "alias", "read",
    "printf", "ulimit", "umask", "eval", "exec", "shift", "type", "wait", "command", "builtin", "hash", "pwd",
    "if", "then", "else", "fi", "for", "do", "done", "while", "case", "esac", "{", "}", "(", ")", "!", "time"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
_URL = re.compile(r"https?://([A-Za-z0-9.-]+)")
_APT = re.compile(r"(^|[\s;&|(])(apt-get|apt|dpkg|aptitude)\s+(-\S+\s+)*(install|update|upgrade|-i)\b")
_FETCH = re.compile(r"(^|[\s;&|(])(curl|wget)\b[^\n;|&]*")
_PYTHON = re.compile(r"(?:uvx|uv\s+(?:venv|run|python\s+install|pip\s+install))[^\n;|&]*?(?:-p|--python)[ =]"
                     r"(?:python)?(\d+\.\d+)")
_UV = re.compile(r"(^|[\s;&|(/])(uv|uvx)\s")
_INSTALL = re.compile(r"(?:^|[\s;&|(])(?:(?:pip3?|python3?\s+-m\s+pip|uv\s+pip)\s+install|uv\s+add|uv\s+tool\s+install)"
                      r"\b([^\n;|&]*)")
_UVX_PACKAGES = re.compile(r"(?:^|[\s;&|(])uvx\b")
UV_INSTALLER_URL = re.compile(r"https://astral\.sh/uv/(\d+\.\d+\.\d+)/install\.sh")
"""uv's standalone installer at a pinned version (an unpinned one has no version to provide)."""
_INSTALLER_HELPERS = frozenset({"curl", "ca-certificates"})
"""What apt lines install only to fetch an installer."""
_MAX_SCRIPT_BYTES = 1 << 20
_SCRIPT_DEPTH = 3


@dataclass(frozen=True)
class Available:
    """What an evaluation here offers."""

    network_hosts: frozenset[str] = frozenset()
    """Hosts the evaluation may reach (none: no network)."""
    package_index: bool = False
    python: str = f"{sys.version_info.major}.{sys.version_info.minor}"
    uv: bool = False
    uv_installer: bool = False
    """uv's installer is provided (`uv_installer.py`): an evaluation in the task's container with the index."""


def available_here(package_index: bool = False, in_container: bool = False) -> Available:
    """What an evaluation on this machine offers: uv when its tools hold uv
    (`toolenv.tools_have_uv`), a package index when the evaluation gets the index proxy, uv's installer
    when it runs in the task's container with the index."""
    return Available(package_index=package_index, uv=tools_have_uv(), uv_installer=package_index and in_container)


def task_scripts(query: Query) -> list[str]:
    """The text of `query`'s test commands and of the task's own scripts they run, and those these run
    (`_SCRIPT_DEPTH` levels), each once (never the workspace's)."""
    texts = list(query.test_commands)
    root, hidden = Path(query.root), Path(query.hidden_tests_dir)
    seen: set[Path] = set()
    level = list(query.test_commands)
    for _ in range(_SCRIPT_DEPTH):
        found = []
        for command in level:
            for word in _words(command):
                for candidate in _script_candidates(root, hidden, word):
                    if candidate in seen or not candidate.is_file() or candidate.stat().st_size > _MAX_SCRIPT_BYTES:
                        continue
                    seen.add(candidate)
                    found.append(candidate.read_text(encoding="utf-8", errors="replace"))
        texts += found
        level = found
    return texts


def task_plugins(query: Query) -> tuple[str, ...]:
    """The pytest plugin distributions (`pytest-*`) the task's own scripts install (`pip install
    pytest-json-ctrf==0.3.5`, `uvx -w pytest-json-ctrf pytest --ctrf ...`), canonical names, sorted.
    Plugin autoloading stays off in every evaluation; gyre's plugin loads these by name (and only these,
    never from the workspace), as the task's own run would have them loaded."""
    found: set[str] = set()
    for text in task_scripts(query):
        for line in text.splitlines():
            line = line.split("#", 1)[0]
            if not (_INSTALL.search(line) or _UVX_PACKAGES.search(line)):
                continue
            for word in _words(line):
                name = re.split(r"[=<>~!\[;@ ]", word.strip("'\""), maxsplit=1)[0]
                if re.fullmatch(r"pytest[-_.][A-Za-z0-9][A-Za-z0-9_.-]*", name):
                    found.add(canonicalize_name(name))
    return tuple(sorted(found))


def test_hosts(query: Query) -> set[str]:
    """`network:<host>` for each remote host a hidden Python test file's code fetches from
    (`fetched_urls.fetched_hosts`: a URL passed to a network client's call, the network not mocked): a test
    that calls a remote judge can only fail here, so the task is unscorable, never a 0. Loopback hosts are the
    task's own servers."""
    hidden = Path(query.hidden_tests_dir)
    needs: set[str] = set()
    for rel in query.test_files:
        path = hidden / rel
        if path.suffix != ".py" or not path.is_file() or path.is_symlink() or path.stat().st_size > _MAX_SCRIPT_BYTES:
            continue
        needs |= {f"network:{host}" for host in fetched_hosts(path.read_text(encoding="utf-8", errors="replace"))}
    return needs


def task_needs(query: Query, image_holds_packages: bool = False) -> list[str]:
    """Sorted needs of `query`'s test commands, the task scripts they run, and its hidden Python tests.
    `image_holds_packages`: the task is tested in its own image, built with its packages (NL2RepoBench in
    docker, `nl2repo_image`): they need no index at evaluation time."""
    texts = task_scripts(query)
    clash = _tool_clash(query)
    programs = {f"{PROGRAM}:{name}" for name in command_programs(query.test_commands) if not program_available(name)}
    # installed from the index first, unless the image holds them
    image = {PACKAGE_INDEX} if not image_holds_packages and beyond_tools(_image_packages(query)) else set()
    return sorted(set().union(*(script_needs(t) for t in texts), programs, image, test_hosts(query),
                              {f"{TOOL_CLASH}:{clash}"} if clash else set()))


def command_programs(commands: list[str]) -> set[str]:
    """The programs `commands` start by name (see `program:` in the module docstring)."""
    found = set()
    for command in commands:
        for part in re.split(r"&&|\|\||;|\||\n", command):
            words = _words(part)
            while words and _ASSIGNMENT.fullmatch(words[0]):
                words.pop(0)
            if words and "/" not in words[0] and "$" not in words[0] and words[0] not in SHELL_WORDS:
                found.add(words[0])
    return found


def program_available(name: str) -> bool:
    """Whether an evaluation command finds `name`: the environment's own programs, or the system's PATH."""
    from gyre.evaluators.environments.toolenv import _WRAPPERS, SYSTEM_PATH, UV_BINARIES, _python_names

    own = {*_WRAPPERS, *_python_names(), "python3", *(UV_BINARIES if tools_have_uv() else ())}
    return name in own or shutil.which(name, path=SYSTEM_PATH) is not None


def beyond_tools(requirements: tuple[str, ...]) -> tuple[str, ...]:
    """The requirements that name no distribution the evaluation's tools already hold (pytest, pluggy, ...):
    an image that only pins pytest is scorable without an index (with one, its pin is installed)."""
    tools = {canonicalize_name(d.metadata["Name"]) for d in tool_distributions()}
    return tuple(r for r in requirements if canonicalize_name(re.split(r"[\s\[=<>!~;@]", r, maxsplit=1)[0]) not in tools)


def _image_packages(query: Query) -> tuple[str, ...]:
    """The packages the task's image holds (`TaskSpec.image_packages`: NL2RepoBench's start.md, a Terminal-Bench
    or Harbor Dockerfile's pip installs); () for a query that is no task directory of a known format."""
    from gyre.benchmarks.registry import detect_format, task_spec

    try:
        detect_format(Path(query.root))
    except Exception:  # not a task directory this reading knows: no image to reproduce
        return ()
    return task_spec(query).image_packages


def _tool_clash(query: Query) -> str | None:
    """The tool distribution an NL2RepoBench project is named like (its name or a module it provides), if any."""
    from gyre.benchmarks.registry import detect_format
    from gyre.benchmarks.spec import NL2REPO

    try:
        if detect_format(Path(query.root)) != NL2REPO:
            return None
    except Exception:  # not a task directory this reading knows: no clash to report
        return None
    return _tool_names().get(canonicalize_name(query.query_id))


@lru_cache(maxsize=1)
def _tool_names() -> dict[str, str]:
    """Canonical names of the tool distributions and of the top-level modules they hold -> the distribution."""
    names: dict[str, str] = {}
    for dist in tool_distributions():
        for name in (dist.metadata["Name"], *top_level_modules(dist)):
            names.setdefault(canonicalize_name(name), canonicalize_name(dist.metadata["Name"]))
    return names


def script_needs(text: str) -> set[str]:
    """Needs one shell text states (comments ignored)."""
    text = "\n".join(line.split("#", 1)[0] if not line.lstrip().startswith("#!") else "" for line in text.splitlines())
    needs: set[str] = set()
    fetches = [fetch.group(0) for fetch in _FETCH.finditer(text) if _URL.search(fetch.group(0))]  # not `install curl`
    installers = [v for fetch in fetches for v in UV_INSTALLER_URL.findall(fetch)]
    only_installer = bool(installers) and all(UV_INSTALLER_URL.search(fetch) for fetch in fetches)
    if any(not (only_installer and _installs_only(line, _INSTALLER_HELPERS)) for line in text.splitlines()
           if _APT.search(line)):
        needs.add(APT)
    needs |= {f"{UV_INSTALLER}:{version}" for version in installers}
    for fetch in fetches:
        if not UV_INSTALLER_URL.search(fetch):
            needs |= {f"network:{host.lower()}" for host in _URL.findall(fetch)}
    needs |= {f"python:{version}" for version in _PYTHON.findall(text)}
    if _UV.search(text):
        needs.add(UV)
    for install in _INSTALL.finditer(text):
        words = install.group(1).split()
        local = {words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-e", "--editable")}
        named = [w for w in words if not w.startswith("-") and w not in local and not w.startswith((".", "/", "$"))]
        if named or "-r" in words or "--requirement" in words:
            needs.add(PACKAGE_INDEX)
    if _UVX_PACKAGES.search(text):
        needs.add(PACKAGE_INDEX)  # uvx fetches the tool it runs
    return needs


def unmet(needs: list[str], available: Available) -> list[str]:
    """The needs an evaluation with `available` cannot meet."""
    installs_uv = any(need.startswith(f"{UV_INSTALLER}:") for need in needs)  # uv from its installer, when provided
    missing = []
    for need in needs:
        kind, _, value = need.partition(":")
        if kind == "network" and value not in available.network_hosts:
            missing.append(need)
        elif kind == "python" and value != available.python:
            missing.append(need)
        elif kind == PROGRAM and not program_available(value):
            missing.append(need)
        elif kind == UV_INSTALLER and not available.uv_installer:
            missing.append(need)
        elif need == UV and not (available.uv or (available.uv_installer and installs_uv)):
            missing.append(need)
        elif kind == TOOL_CLASH or need == APT or (
                need == PACKAGE_INDEX and not available.package_index):
            missing.append(need)
    return missing


def _installs_only(line: str, packages: frozenset[str]) -> bool:
    """Whether an apt line only updates the lists or installs some of `packages`."""
    parts = [part for part in re.split(r"&&|\|\||;", line) if _APT.search(part)]
    for part in parts:
        words = [w for w in _words(part) if not w.startswith("-") and not _ASSIGNMENT.fullmatch(w)]
        verbs = [i for i, w in enumerate(words) if w in ("install", "update", "upgrade")]
        if not verbs or words[verbs[0]] == "upgrade":
            return False
        if words[verbs[0]] == "install" and not set(words[verbs[0] + 1:]) <= packages:
            return False
    return True


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def _script_candidates(root: Path, hidden: Path, word: str) -> list[Path]:
    """Files of the task a command word may name (`run-tests.sh`, `/tests/test.sh`, `$TEST_DIR/x.sh`)."""
    if not word.endswith(".sh"):
        return []
    name = PurePosixPath(word.replace("$TEST_DIR", "/tests"))
    parts = name.parts[1:] if name.is_absolute() else name.parts
    rel = PurePosixPath(*parts)
    tail = PurePosixPath(*parts[1:]) if len(parts) > 1 else rel
    return [root / rel, hidden / rel, hidden / tail, root / name.name, hidden / name.name]
