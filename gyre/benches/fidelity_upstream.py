"""The fidelity bench's stand-in for upstream NL2RepoBench: its post-processing, step by step, in its own code.

`gyre bench fidelity` compares gyre's score of a real release with what upstream's harness gives it. This module
is upstream's side, written from upstream's code (`UPSTREAM_REPO` at `UPSTREAM_COMMIT`,
`openhands/post_processor.py: post_process_task` and `docker_self/docker_service.py:
execute_command_in_container`, which runs each command through python-on-whales' `container.execute`) and
sharing nothing with gyre's evaluator (`gyre.evaluators.formats.nl2repo_upstream`), so that the two cannot agree
by sharing a mistake:

1. `remove_package_files`: `os.walk` over the workspace, `os.remove` of every file named in `PACKAGE_FILES`
   (upstream's list, copied here as upstream writes it); a failure is logged and skipped, as upstream does;
2. `remove_test_files`: each `test_files.json` entry, `shutil.rmtree` for a directory, `os.remove` otherwise;
3. `create_dockerfile` + `build_test_image`: the image's `/workspace` (`image_workspace`: the hidden tests, and
   with `with_release_files` the release's own package and configuration files; upstream's images are not
   published, so the bench measures both), then `COPY workspace /workspace` (the cleaned workspace over it, a file
   both hold is the workspace's), `ENV PYTHONPATH=/workspace:$PYTHONPATH` (`$PYTHONPATH` unset: a trailing `:`);
4. `run_test_commands`: each command `shlex.split` and executed as an argv, no shell, in the workspace; what it
   gives is python-on-whales': on exit 0, stdout alone (decoded with replacement, one trailing newline cut); on
   any other exit, the text of its `DockerException` (the command line, the code, stdout and stderr, decoded
   strictly: output that is not UTF-8 makes a `UnicodeDecodeError` whose text is all that is left, exit 1); a
   command that cannot be split or started is an exception too (`return_code` if it has one, else 1);
5. `analyze_pytest_results`: for each command whose text holds "pytest" (any case), every line's
   `(\\d+) passed` summed; `success_rate = min(passed / test_case_count, 1)`.

Departures, each because it runs here without upstream's images: the workspace is a directory of this machine
(its path is not `/workspace`: a command naming `/workspace/...` fails here; none of the bench's projects does),
the environment is a virtualenv of this machine's Python with the packages start.md lists (`fidelity_sources.
standin_env`, cloned per run so that `pip install -e .` never changes the cached one; the project itself
uninstalled when the list brings it, as gyre's task images do: `fidelity.without_the_project`), a command that does not
exist answers 127 as `docker exec` does, and each command has a timeout (upstream has none).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

UPSTREAM_REPO = "multimodal-art-projection/NL2RepoBench"
UPSTREAM_COMMIT = "ae9fb81fc8ab864e9ea45c84e81dd2ce47c7c8b9"
PACKAGE_FILES = [
    "setup.py", "pyproject.toml", "setup.cfg", "requirements.txt", "requirements-dev.txt", "requirements-test.txt",
    "tox.ini", "pytest.ini", "poetry.lock", "Pipfile", "Pipfile.lock", "environment.yml", "conda-env.yaml",
    "manifest.in", "MANIFEST.in",
]
"""`post_processor.py: remove_package_files`'s list, in its order."""
CONTAINER = "python-test-fidelity"
"""The container name upstream's exception text carries (`python-test-<task uuid>`)."""
NOT_FOUND_EXIT = 127
NOT_EXECUTABLE_EXIT = 126
TIMED_OUT_EXIT = -9


@dataclass
class Command:
    """One command as upstream recorded it: its text, exit code and the output it parsed."""

    command: str
    exit_code: int
    output: str


def remove_package_files(workspace_path: Path) -> list[str]:
    """Upstream's step 1; the paths removed."""
    removed = []
    for root, _dirs, files in os.walk(workspace_path):
        for file in files:
            if file in PACKAGE_FILES:
                file_path = os.path.join(root, file)
                try:
                    os.remove(file_path)
                    removed.append(file_path)
                except OSError:
                    pass  # upstream logs a warning and goes on
    return removed


def remove_test_files(workspace_path: Path, test_files: Iterable[str]) -> list[str]:
    """Upstream's step 2; the paths removed."""
    removed = []
    for test_file in test_files:
        target_path = os.path.join(workspace_path, test_file)
        try:
            if os.path.exists(target_path):
                if os.path.isdir(target_path):
                    shutil.rmtree(target_path)
                else:
                    os.remove(target_path)
                removed.append(target_path)
        except OSError:
            pass  # upstream logs an error and goes on
    return removed


def image_workspace(source: Path, test_files: Iterable[str], dest: Path, with_release_files: bool) -> Path:
    """What the project's image holds under `/workspace` (`dest`): the hidden tests as the release has them, and,
    `with_release_files`, every file of the release named in `PACKAGE_FILES`, at its place."""
    dest.mkdir(parents=True)
    for rel in test_files:
        src, dst = source / rel.rstrip("/"), dest / rel.rstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
        elif src.exists():
            shutil.copy2(src, dst, follow_symlinks=False)
    if with_release_files:
        for root, _dirs, files in os.walk(source):
            for file in files:
                if file in PACKAGE_FILES:
                    rel = Path(root, file).relative_to(source)
                    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source / rel, dest / rel, follow_symlinks=False)
    return dest


def copy_over(workspace: Path, image: Path) -> Path:
    """`COPY workspace /workspace` onto the image's `/workspace`: the workspace's files over the image's."""
    shutil.copytree(workspace, image, symlinks=True, dirs_exist_ok=True)
    return image


def execute(command: str, workdir: Path, env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    """`execute_command_in_container`: `shlex.split`, the argv run with no shell; (exit code, output) as
    python-on-whales and upstream's exception handler give them."""
    try:
        command_list = shlex.split(command)
        argv = ["docker", "exec", "--workdir", "/workspace", CONTAINER, *command_list]
        try:
            done = subprocess.run(command_list, cwd=workdir, env=env, capture_output=True, timeout=timeout_s)
            code, stdout, stderr = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            code, stdout, stderr = TIMED_OUT_EXIT, exc.stdout or b"", (exc.stderr or b"") + b"\n[timed out]"
        except FileNotFoundError:
            code, stdout = NOT_FOUND_EXIT, b""
            stderr = _oci_error(command_list[0], "executable file not found in $PATH")
        except PermissionError:
            code, stdout, stderr = NOT_EXECUTABLE_EXIT, b"", _oci_error(command_list[0], "permission denied")
        if code == 0:
            return 0, _post_process_stream(stdout)
        raise _DockerException(argv, code, stdout, stderr)
    except Exception as exc:  # upstream: `exit_code = getattr(e, 'return_code', 1)`, `output = str(e)`
        return getattr(exc, "return_code", 1), str(exc)


def analyze(results: list[Command], total_test_cases: int) -> tuple[int, float]:
    """`analyze_pytest_results`: (passed, success_rate)."""
    passed = 0
    for result in results:
        if "pytest" in result.command.lower():
            for line in result.output.split("\n"):
                passed_match = re.search(r"(\d+) passed", line)
                if passed_match:
                    passed += int(passed_match.group(1))
    return passed, (min(passed / total_test_cases, 1) if total_test_cases > 0 else 0.0)


def run_test_commands(commands: list[str], workspace: Path, env: dict[str, str], timeout_s: float) -> list[Command]:
    """Every command in order in the same place; a failing one never stops the next."""
    results = []
    for command in commands:
        code, output = execute(command, workspace, env, timeout_s)
        results.append(Command(command, code, output))
    return results


def upstream_env(workspace: Path, base: dict[str, str]) -> dict[str, str]:
    """The commands' environment: `base` with the Dockerfile's `ENV PYTHONPATH=/workspace:$PYTHONPATH` (unset)."""
    return {**base, "PYTHONPATH": f"{workspace}:"}


def clone_venv(venv: Path, dest: Path) -> Path:
    """A private copy of the virtualenv `venv` at `dest`, its scripts' shebangs pointed at the copy: the commands'
    `pip install -e .` goes into it, never into the cached one."""
    shutil.copytree(venv, dest, symlinks=True)
    old, new = f"#!{venv}/bin/".encode(), f"#!{dest}/bin/".encode()
    for script in (dest / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            data = script.read_bytes()
            if data.startswith(old):
                script.write_bytes(new + data[len(old):])
    for name in ("activate", "activate.csh", "activate.fish"):
        path = dest / "bin" / name
        if path.is_file():
            path.write_text(path.read_text(encoding="utf-8").replace(str(venv), str(dest)), encoding="utf-8")
    return dest


class _DockerException(Exception):
    """python-on-whales' `DockerException`: its text carries the command line, the code, stdout and stderr, each
    decoded strictly (a `UnicodeDecodeError` escapes the constructor on bytes that are not UTF-8)."""

    def __init__(self, command_launched: list[str], return_code: int, stdout: bytes | None, stderr: bytes | None):
        self.return_code = return_code
        stdout_text = None if stdout is None else stdout.decode()
        stderr_text = None if stderr is None else stderr.decode()
        message = (f"The command executed was `{' '.join(command_launched)}`.\n"
                   f"It returned with code {return_code}\n"
                   f"The content of stdout is '{stdout_text}'\n"
                   f"The content of stderr is '{stderr_text}'\n")
        super().__init__(message)


def _post_process_stream(stream: bytes | None) -> str:
    if stream is None:
        return ""
    text = stream.decode(errors="replace")
    return text[:-1] if text.endswith("\n") else text


def _oci_error(program: str, why: str) -> bytes:
    return (f"OCI runtime exec failed: exec failed: unable to start container process: exec: \"{program}\": "
            f"{why}: unknown\n").encode()
