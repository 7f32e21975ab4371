"""`gyre bench eval-overhead [-n N] [--json]`: where one evaluation's time goes, phase by phase.

Why it exists: since the evaluator was hardened (per-evaluation venv, result channel,
canaries, seccomp, privilege drop with a staging mount namespace, the reward-hacking
monitor) the RL part of `make run` takes about twice as long, and nobody had measured
where. This script builds tiny-benchmark queries exactly as `make run` does
(`configs/tiny-cpu.yaml` through `gyre.runtime.resolve.resolve_queries`), writes workspaces an
agent could have left (the reference solution, a wrong one, an empty one) and scores them
through `gyre.evaluators.evaluate_query` with the run's evaluator settings and the
coordinator's isolation, timing every phase with wrappers installed from outside (nothing
in `gyre` is edited to be measured).

It reports, per phase, the mean milliseconds per evaluation for each variant, all measured
in the same process and interleaved (evaluation i runs every variant before i+1), so
machine noise hits them alike:

- `baseline`: the code before this bench's fixes, emulated by monkeypatching: the privilege
  drop stages every bound source through the root prelude (one `mount` process each), as
  before `gyre.sandboxes.local.privileges.open_to_all`, and the tools directory holds no `.pyc`
  files (`uncompiled_tools_dir` below), as before `toolenv` byte-compiled it;
- `current`: the code as it is.

Then: the monitor's installed-file index build (once per process: importlib's `dist.files`
before, the RECORD text now); one `bash -c true` bare vs through `Isolation.run` layer by
layer (the wrapping before the hardening included); pytest's start-up in an evaluation venv
(tools as built, and compiled) vs gyre's own venv. `--profile` adds a cProfile of the host
side of the `current` variant. `gyre bench eval-overhead -n 4 --repeat 3` is a quick run.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gyre.config.run import load_config
from gyre.evaluators import evaluate_query, index_access, observed
from gyre.evaluators.environments import toolenv
from gyre.evaluators.formats import nl2repo
from gyre.evaluators.integrity import channel, copied, monitor, plugin_install
from gyre.runtime.resolve import resolve_queries
from gyre.sandboxes.base import SandboxLimits
from gyre.sandboxes.layout import SandboxLayout
from gyre.sandboxes.local import cgroups, isolation, privileges
from gyre.sandboxes.local.isolation import Isolation

# (label, indent): the table's rows, in evaluation order; indented rows are parts of the row above.
ROWS = [
    ("workspace copy", 0), ("guard, pristine tests, hand over, protect", 0), ("make_env (venv + .pth)", 0),
    ("venv.EnvBuilder.create", 1), ("tools_dir", 1), ("plugin install", 0), ("Isolation.run", 0),
    ("Stage.create", 1), ("seccomp fd (compile + pipe)", 1), ("argv (setpriv + bwrap)", 1), ("cgroup create", 1),
    ("run_command", 1), ("spawn -> plugin hello (sandbox + python + import pytest)", 2),
    ("hello -> session (pytest configure)", 2), ("session -> collected (import tests)", 2),
    ("collected -> finish (run tests)", 2), ("finish -> exit (teardown, namespace exit)", 2),
    ("cgroup remove", 1), ("stage remove", 1), ("monitor: scan_workspace", 0),
    ("score write", 0), ("other", 0), ("TOTAL evaluate_query", 0), ("TOTAL evaluate_query (median)", 0),
]
TOP = [label for label, indent in ROWS if indent == 0 and label != "other" and not label.startswith("TOTAL")]


class Clock:
    """Per-phase seconds of the evaluation being measured (`current`), and when each plugin message came."""
    current: dict[str, float] | None = None
    events: dict[str, float] = {}

    def add(self, label: str, seconds: float) -> None:
        if self.current is not None:
            self.current[label] = self.current.get(label, 0.0) + seconds


CLOCK = Clock()


def timed(label: str, fn: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            CLOCK.add(label, time.perf_counter() - started)
    wrapper.__wrapped__ = fn
    return wrapper


def instrument() -> None:
    """Wrap every phase (module attributes the evaluator looks up at call time)."""
    for name in ("neutralise_pytest_config", "write_pristine", "pin_rootdir", "protect"):
        setattr(nl2repo, name, timed("guard, pristine tests, hand over, protect", getattr(nl2repo, name)))
    nl2repo.copy_workspace = timed("workspace copy", nl2repo.copy_workspace)
    isolation.Isolation.hand_over = timed("guard, pristine tests, hand over, protect", isolation.Isolation.hand_over)
    observed.make_env = timed("make_env (venv + .pth)", observed.make_env)
    toolenv.tools_dir = timed("tools_dir", toolenv.tools_dir)
    toolenv.venv.EnvBuilder.create = timed("venv.EnvBuilder.create", toolenv.venv.EnvBuilder.create)
    write = plugin_install.PluginInstall.write.__func__
    plugin_install.PluginInstall.write = classmethod(timed("plugin install", write))
    isolation.Isolation.run = timed("Isolation.run", isolation.Isolation.run)
    privileges.Stage.create = classmethod(timed("Stage.create", privileges.Stage.create.__func__))
    privileges.Stage.remove = timed("stage remove", privileges.Stage.remove)
    isolation.seccomp_fd = timed("seccomp fd (compile + pipe)", isolation.seccomp_fd)
    isolation.drop_argv = timed("argv (setpriv + bwrap)", isolation.drop_argv)
    isolation.bwrap_argv = timed("argv (setpriv + bwrap)", isolation.bwrap_argv)
    isolation.create_cgroup = timed("cgroup create", isolation.create_cgroup)
    cgroups.CgroupV1.remove = timed("cgroup remove", cgroups.CgroupV1.remove)
    isolation.run_command = _run_command_split(isolation.run_command)
    add = channel.ChannelResults.add

    def add_event(self, message):  # runs on the channel's reader thread: first time each event arrives
        CLOCK.events.setdefault(str(message.get("event")), time.perf_counter())
        return add(self, message)
    channel.ChannelResults.add = add_event
    monitor.scan_workspace = timed("monitor: scan_workspace", monitor.scan_workspace)
    write_text = Path.write_text

    def timed_write_text(self, *args, **kwargs):
        if self.name != "score.json":
            return write_text(self, *args, **kwargs)
        return timed("score write", write_text)(self, *args, **kwargs)
    Path.write_text = timed_write_text


def _run_command_split(run_command: Callable) -> Callable:
    """run_command, its time cut at the plugin's messages (spawn, hello, session, collected, finish, exit)."""
    def wrapper(*args, **kwargs):
        CLOCK.events = {}
        started = time.perf_counter()
        result = run_command(*args, **kwargs)
        ended = time.perf_counter()
        CLOCK.add("run_command", ended - started)
        marks = [("spawn -> plugin hello (sandbox + python + import pytest)", "hello"),
                 ("hello -> session (pytest configure)", "session"),
                 ("session -> collected (import tests)", "collected"),
                 ("collected -> finish (run tests)", "finish")]
        previous = started
        for label, event in marks:
            at = CLOCK.events.get(event)
            if at is not None:
                CLOCK.add(label, at - previous)
                previous = at
        CLOCK.add("finish -> exit (teardown, namespace exit)", ended - previous)
        return result
    return wrapper


# -- variants ------------------------------------------------------------------------------------

def uncompiled_tools_dir(root: Path) -> Callable[[], Path]:
    """The tools directory as it was before `toolenv` byte-compiled it: a copy without `.pyc` files."""
    built: dict[str, Path] = {}
    as_built = getattr(toolenv.tools_dir, "__wrapped__", toolenv.tools_dir)  # before `instrument` wraps it

    def tools_dir(_root=None) -> Path:
        if "dir" not in built:
            target, staging = root / "toolenv-uncompiled", root / "toolenv-staging"
            shutil.copytree(as_built(), staging, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
            for path in [staging, *staging.rglob("*")]:
                if not path.is_symlink():
                    path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
            staging.rename(target)
            built["dir"] = target
        return built["dir"]
    return tools_dir


@contextmanager
def patched(obj, name: str, value) -> Iterator[None]:
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


@contextmanager
def variant(name: str, before_tools: Callable[[], Path] | None) -> Iterator[None]:
    """`baseline`: every bound source staged by the root prelude, as before `privileges.open_to_all`,
    and tools without `.pyc` files; `current`: the code as it is."""
    if name == "baseline":
        with patched(privileges, "open_to_all", lambda *_: False), \
                patched(toolenv, "tools_dir", timed("tools_dir", before_tools)):
            yield
    else:
        yield


def index_as_before() -> dict[str, str]:
    """`copied.installed_hashes` before it read RECORD text itself (importlib's `dist.files`)."""
    from importlib import metadata

    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = f"{dist.metadata['Name']} {dist.version}"
        for record in dist.files or ():
            if record.hash is not None and record.hash.mode == "sha256" and record.name.endswith(".py") \
                    and (record.size or 0) >= copied.MIN_BYTES:
                found.setdefault(record.hash.value, f"{name}: {record}")
    return found


# -- the evaluations ---------------------------------------------------------------------------

def workspaces(queries, base: Path, n: int) -> Iterator[tuple[object, Path]]:
    """n (query, kept workspace) pairs: reference, wrong and empty workspaces in turn."""
    from gyre.benchmarks.tiny import tiny_reference

    for i in range(n):
        query = queries[i % len(queries)]
        ws = base / f"ws-{i:03d}"
        ws.mkdir(parents=True)
        rel, source = tiny_reference(query)
        if i % 3 == 0:
            (ws / rel).write_text(source)
        elif i % 3 == 1:
            (ws / rel).write_text("def nothing():\n    return None\n")
        yield query, ws


def evaluate_all(config, queries, iso: Isolation, base: Path, n: int, names: list[str],
                 before_tools, profile: cProfile.Profile | None) -> dict[str, list[dict[str, float]]]:
    per_variant: dict[str, list[dict[str, float]]] = defaultdict(list)
    for i, (query, ws) in enumerate(workspaces(queries, base / "kept", n)):
        for name in names[i % len(names):] + names[:i % len(names)]:  # each variant first in turn
            with variant(name, before_tools):
                CLOCK.current = {}
                if profile is not None and name == "current":
                    profile.enable()
                started = time.perf_counter()
                score = evaluate_query(query, ws, base / "evals" / f"{name}-{i:03d}", f"bench-{name}-{i}",
                                       timeout_s=config.evaluator.timeout_s, isolation=iso,
                                       monitor=config.evaluator.monitor, index=index_access(config.evaluator))
                total = time.perf_counter() - started
                if profile is not None and name == "current":
                    profile.disable()
                phases, CLOCK.current = CLOCK.current, None
                if score.status.value == "error":
                    print(f"  {name} #{i}: evaluator error: {score.detail}", file=sys.stderr)
                phases["TOTAL evaluate_query"] = total
                phases["other"] = total - sum(phases.get(label, 0.0) for label in TOP)
                per_variant[name].append(phases)
    return per_variant


# -- start-up comparisons ----------------------------------------------------------------------

def median_ms(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def true_layers(iso: Isolation, base: Path, repeat: int) -> list[tuple[str, float]]:
    """One `bash -c true`: bare, then through Isolation.run with more and more of its layers."""
    ws, scratch = base / "true-ws", base / "true-tmp"
    ws.mkdir()
    iso.hand_over(ws)

    def through(i: Isolation) -> Callable[[], object]:
        return lambda: i.run("true", workspace=ws, scratch=scratch, layout=SandboxLayout(),
                             env={"PATH": "/usr/bin:/bin"}, limits=SandboxLimits(), timeout_s=30)

    def no_seccomp(argv_fn: Callable) -> Callable:
        def argv(*args, **kwargs):
            return argv_fn(*args, **{**kwargs, "seccomp_fd": None})
        return argv
    rows = [("bash -c true, bare subprocess", median_ms(lambda: subprocess.run(["bash", "-c", "true"]), repeat)),
            ("Isolation.run, none (prlimit)", median_ms(through(Isolation(None, False)), repeat))]
    if iso.cgroups:
        rows.append(("Isolation.run, none + cgroup", median_ms(through(Isolation(None, True)), repeat)))
    if not iso.bwrap:
        return rows
    plain = Isolation(iso.bwrap, False, None)  # as root when gyre is: what the sandbox was before the drop
    with patched(isolation, "bwrap_argv", no_seccomp(isolation.bwrap_argv)):
        rows.append(("bwrap, no drop, no seccomp (the wrapping before hardening)", median_ms(through(plain), repeat)))
    rows.append(("bwrap + seccomp, no drop", median_ms(through(plain), repeat)))
    if iso.user is not None:
        dropped = Isolation(iso.bwrap, False, iso.user)
        with patched(privileges, "open_to_all", lambda *_: False):
            rows.append(("bwrap + seccomp + drop, every source staged (baseline)", median_ms(through(dropped), repeat)))
        rows.append(("bwrap + seccomp + drop, unreachable sources staged (current)",
                     median_ms(through(dropped), repeat)))
    rows.append(("Isolation.run as the run uses it (+ cgroup)", median_ms(through(iso), repeat)))
    return rows


def pytest_startup(base: Path, compiled: Path, repeat: int) -> list[tuple[str, float]]:
    """`python -m pytest -q` on one trivial test, with the evaluation's variables, in three interpreters."""
    project = base / "pytest-project"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    rows = []
    for label, tools in (("eval venv, tools as built (compiled)", None), ("eval venv, tools without .pyc (before)", compiled)):
        env_root = base / f"pytest-env-{len(rows)}"
        env = toolenv.make_env(env_root, False)
        if tools is not None:  # the .pth line names the tools directory (or its site/): point it at the copy
            pth = toolenv.site_packages(env.directory) / "_gyre_tools.pth"
            pth.write_text(pth.read_text().replace(str(env.tools), str(tools)))
        rows.append((label, _pytest_ms(project, f"{env.directory}/bin", repeat)))
    rows.append(("gyre's venv (sys.executable)", _pytest_ms(project, str(Path(sys.executable).parent), repeat)))
    return rows


def _pytest_ms(project: Path, bin_dir: str, repeat: int) -> float:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "HOME": str(project)}
    command = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    return median_ms(lambda: subprocess.run(command, cwd=project, env=env, capture_output=True, check=True), repeat)


# -- the measurement ---------------------------------------------------------------------------

VARIANTS = ("baseline", "current")


def phase_means(per_variant: dict[str, list[dict[str, float]]]) -> list[dict]:
    """One row per phase of `ROWS`: its label, indent and each variant's mean ms per evaluation
    (the median for the TOTAL (median) row)."""
    rows = []
    for label, indent in ROWS:
        stat, key = (statistics.median, "TOTAL evaluate_query") if label.endswith("(median)") else (statistics.fmean, label)
        rows.append({"phase": label, "indent": indent,
                     "ms": {n: stat([p.get(key, 0.0) for p in runs]) * 1000 for n, runs in per_variant.items()}})
    return rows


def run(config_path: Path, n: int = 12, variants: tuple[str, ...] = VARIANTS, repeat: int = 10,
        profile: bool = False, keep: bool = False) -> dict:
    """Score `n` tiny workspaces per variant, interleaved, phase by phase; then the start-up
    comparisons. Returns the figures (and, with `profile`, the current variant's top functions)."""
    unknown = set(variants) - set(VARIANTS)
    if unknown or not variants:
        raise ValueError(f"variants must be some of {', '.join(VARIANTS)}, got {', '.join(variants) or 'none'}")
    config = load_config(config_path)
    base = Path(tempfile.mkdtemp(prefix="gyre-eval-bench-"))
    base.chmod(0o755)  # like the run directory under the checkout, so staging sees what `make run` shows it
    config = config.model_copy(update={"cache_dir": base / "cache"})  # the same generated set, built privately
    queries = resolve_queries(config).eval
    iso = Isolation.detect(config.sandbox.isolation)
    setting = {"config": str(config_path), "held_out_queries": len(queries), "timeout_s": config.evaluator.timeout_s,
               "monitor": config.evaluator.monitor, "network": config.evaluator.network, "isolation": iso.mode,
               "cgroups": bool(iso.cgroups), "user": iso.user, "evaluations_per_variant": n}
    before_tools = uncompiled_tools_dir(base)
    instrument()
    # warm-up: build the tools directory, import everything, once per variant (not measured)
    evaluate_all(config, queries, iso, base / "warm", 1, list(variants), before_tools, None)
    profiler = cProfile.Profile() if profile else None
    try:
        per_variant = evaluate_all(config, queries, iso, base / "run", n, list(variants), before_tools, profiler)
        result = {
            "setting": setting, "phases": phase_means(per_variant),
            "index_build_ms": {"before: importlib dist.files": median_ms(index_as_before, 3),
                               "now: RECORD text, csv": median_ms(copied.build_index, 3)},
            "true_ms": dict(true_layers(iso, base, repeat)),
            "pytest_startup_ms": dict(pytest_startup(base, before_tools(), repeat)),
        }
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
            result["profile"] = out.getvalue()
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    if keep:
        result["kept"] = str(base)
    return result
