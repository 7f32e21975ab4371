"""The project's own pytest settings, kept: only what can serve nothing but forging is taken out.

Upstream runs the hidden tests with the project's own configuration, and real projects depend on it:
tqdm collects `tests_*.py` (`python_files`), emoji imports its helpers through `pythonpath`, aiofiles'
async tests need `asyncio_mode = auto`. Not the agent's: NL2RepoBench deletes the workspace's
`pyproject.toml`, `setup.cfg`, `tox.ini`, `pytest.ini`, ... before testing, and the files that configure
pytest are the task image's (`formats/nl2repo_upstream.py`: gyre reads them from the task's
`image_workspace/`); R2E-Gym's are the repository's at the base commit (`formats/r2e.py` restores
them). gyre pins pytest's rootdir with a `pytest.ini` of its own at the repository root
(`pytest_guard.pin_rootdir`), which takes precedence over any other configuration; `project_settings`
reads the project's (in pytest's own order of files) and the pin carries its settings on, less these:

- `-p NAME` in `addopts` (loads a module of the workspace as a plugin, before any test: the classic
  forging route); `-p no:NAME` stays (it only turns a plugin off);
- options that move pytest's configuration or rootdir (`-c`, `--config-file`, `--rootdir`, `-o`,
  `--override-ini`, `--confcutdir`, `--inifile`), change how test modules are imported
  (`--import-mode`), or that delete a directory of their choosing (`--basetemp`);
- the debugger's options (`--trace`, `--pdb`, `--pdbcls=module:Class`): with `--trace` pytest calls the
  named class's `runcall(test)` for every test, which a workspace's class can answer without calling it
  (issue 47);
- `required_plugins` and `minversion`: they can only stop pytest before it collects anything, a usage
  error that would drop the sample instead of scoring it.

Each removal is listed in `reports/neutralised.txt`. Everything else a project may set only changes
which tests are collected and how they run; the hidden tests that do not run count as failed.
"""

from __future__ import annotations

import configparser
import shlex
import tomllib
from pathlib import Path

from gyre.evaluators.integrity.pristine import DEFAULT_PYTHON_FILES

SettingValue = str | list[str]

DROPPED_KEYS = ("required_plugins", "minversion")
MOVING_OPTIONS = ("-c", "--config-file", "--rootdir", "-o", "--override-ini", "--confcutdir", "--inifile",
                  "--basetemp", "--import-mode", "--pdbcls")
"""addopts options that take a value and move pytest's configuration, rootdir, temporary root or import mode, or
name a debugger class."""
DEBUGGER_FLAGS = ("--trace", "--pdb")
"""addopts flags that hand every test (or every failure) to a debugger class."""


def project_settings(repo: Path) -> tuple[dict[str, SettingValue], str | None]:
    """The pytest settings of `repo`'s root configuration and the file they come from, in pytest's order:
    pytest.toml, .pytest.toml, pytest.ini, .pytest.ini, pyproject.toml (`[tool.pytest]` or
    `[tool.pytest.ini_options]`), tox.ini (`[pytest]`), setup.cfg (`[tool:pytest]`). A file pytest would
    pick but could not parse gives no settings (the pin replaces it; pytest would have stopped on it)."""
    for name, read in (("pytest.toml", _toml_table("pytest")), (".pytest.toml", _toml_table("pytest")),
                       ("pytest.ini", _ini_section("pytest", always=True)),
                       (".pytest.ini", _ini_section("pytest", always=True)),
                       ("pyproject.toml", _pyproject), ("tox.ini", _ini_section("pytest")),
                       ("setup.cfg", _ini_section("tool:pytest"))):
        path = repo / name
        if path.is_symlink() or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        found = read(text)
        if found is not None:
            return found, name
    return {}, None


def sanitise(settings: dict[str, SettingValue], source: str) -> tuple[dict[str, SettingValue], list[str]]:
    """`settings` less what only serves forging (module docstring); the removals, one line each."""
    kept: dict[str, SettingValue] = {}
    removed: list[str] = []
    for key, value in settings.items():
        if key in DROPPED_KEYS:
            removed.append(f"dropped {key} from {source}'s pytest settings")
        elif key == "addopts":
            args, dropped = _safe_addopts(value if isinstance(value, list) else _split(value))
            removed += [f"dropped {' '.join(d)} from {source}'s addopts" for d in dropped]
            if args:
                kept[key] = shlex.join(args)
        else:
            kept[key] = value
    return kept, removed


def python_files(settings: dict[str, SettingValue]) -> tuple[str, ...]:
    """The `python_files` patterns `settings` give pytest (its default when they set none)."""
    value = settings.get("python_files")
    if not value:
        return DEFAULT_PYTHON_FILES
    patterns = value if isinstance(value, list) else value.split()
    return tuple(p for item in patterns for p in item.split())


def render_ini(settings: dict[str, SettingValue]) -> str:
    """The `[pytest]` section's lines for `settings` (lists one item a line, indented)."""
    lines = []
    for key, value in settings.items():
        if isinstance(value, list):
            lines.append(f"{key} =" + "".join(f"\n    {item}" for item in value))
        else:
            text = str(value).replace("\n", "\n    ")
            lines.append(f"{key} = {text}")
    return "\n".join(lines) + ("\n" if lines else "")


def _safe_addopts(args: list[str]) -> tuple[list[str], list[list[str]]]:
    kept: list[str] = []
    dropped: list[list[str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        if arg == "-p" or (arg.startswith("-p") and len(arg) > 2):
            value = args[i + 1] if arg == "-p" and i + 1 < len(args) else arg[2:]
            width = 2 if arg == "-p" else 1
            if value.startswith("no:"):
                kept += args[i:i + width]
            else:
                dropped.append(args[i:i + width])
            i += width
        elif arg in DEBUGGER_FLAGS:
            dropped.append([arg])
            i += 1
        elif name in MOVING_OPTIONS or (name[:2] in ("-c", "-o") and not name.startswith("--")):
            width = 1 if "=" in arg or (len(arg) > 2 and not arg.startswith("--")) else 2
            dropped.append(args[i:i + width])
            i += width
        else:
            kept.append(arg)
            i += 1
    return kept, dropped


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _value(value) -> SettingValue:
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _toml_table(*keys: str):
    def read(text: str) -> dict[str, SettingValue] | None:
        try:
            table = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError):
            return None
        for key in keys:
            table = table.get(key) if isinstance(table, dict) else None
        if not isinstance(table, dict):
            return None
        return {k: _value(v) for k, v in table.items() if not isinstance(v, dict)}
    return read


def _pyproject(text: str) -> dict[str, SettingValue] | None:
    native = _toml_table("tool", "pytest")(text)
    legacy = _toml_table("tool", "pytest", "ini_options")(text)
    if legacy is not None:
        return legacy
    return native or None


def _ini_section(section: str, always: bool = False):
    """An ini file's section; `always`: the file counts even without it (pytest.ini does)."""
    def read(text: str) -> dict[str, SettingValue] | None:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(text)
        except configparser.Error:
            return {} if always else None
        if not parser.has_section(section):
            return {} if always else None
        return {key: _lines(value) for key, value in parser[section].items()}
    return read


def _lines(value: str) -> SettingValue:
    parts = [line.strip() for line in value.splitlines() if line.strip()]
    return parts if len(parts) > 1 else (parts[0] if parts else "")
