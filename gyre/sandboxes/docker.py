"""DockerSandbox: one container per execution through the docker SDK (`pip install gyre-rl[docker]`).

For tasks that ship an image (Terminal-Bench, Harbor, R2E-Gym) and hosts running a
Docker engine on the same kernel (the bridge socket and the result FIFO below are host
files seen through bind mounts: a VM-backed engine such as Docker Desktop cannot pass them).
The container gets: no network (`network_mode="none"`), a pids / memory / CPU cap from
`SandboxLimits`, no capabilities, no privilege escalation, a read-only root filesystem with
a tmpfs `/tmp`, and these host mounts, all made at creation (a running container takes no
new ones):

- the workspace at the task's workdir (`/app` by default), read-write;
- the proxy bridge's directory at `/run/gyre` (read-only; `open_proxy`), empty until a CLI
  harness opens the route: `gyre.sandboxes.bridge`'s inside half (a few lines of python3 in
  the image) forwards 127.0.0.1:<proxy port> to its unix socket, so the base URL means the
  same inside, and `network_mode` stays `none`. An image without python3 fails the harness's
  command at once with a message saying so. The harness's own program must be in the image
  (no host installation is bound in: `claude` at its host path, mini-swe-agent in gyre's venv).
  The alternative, not used: `network_mode="bridge"` with
  `extra_hosts={"host.docker.internal": "host-gateway"}` and the proxy listening on the docker
  bridge address; that gives the container a network.
- evaluation slots (`eval_slots`, name -> inside path; `gyre.evaluators.formats.in_container`): empty
  host directories under `<workspace>/../.<name>.docker/`, owned by the evaluation's user
  (`evaluation_user()`: uid/gid 65533 when gyre is root, else gyre's own), mode 0700, the
  tests and the plugin read-only inside. The agent (the image's user, root without
  capabilities) cannot list or open them; `agent_dirs` inside them (Harbor's `logs/agent`) are
  its own (0777).

Commands run with `docker exec` as `bash -c`; the container is removed at `close()`, the
workspace kept. `end_agent()` stops the agent's commands still running and its proxy route
and leaves the container (and what the agent left running in it) for the evaluation.

The exact SDK calls (what the unit tests check against the SDK's own signatures):

    docker.from_env(timeout=10).ping()                                  engine_problem()
    docker.from_env().containers.run(**container_kwargs(...))           create()
    container.exec_run(["bash", "-c", cmd], workdir=W, environment={"GYRE_EXEC": token},
                       demux=True)                                      exec(): an agent command
    container.exec_run(["bash", "-c", KILL_EXECS, "gyre-kill", token, ...], demux=True)
                                        its timeout, end_agent(): kill the processes carrying the token
    container.exec_run(["bash", "-c", cmd], user="U:G", workdir=W, environment=E, demux=True)
                                                                        run_as(): an evaluation command
    container.exec_run(["bash", "-c", "kill -s INT -1; true"], user="U:G", demux=True)
                                        run_as(): its timeout (then KILL; KILL always after it, for leftovers)
    container.reload(); container.status; container.start()             ensure_running()
    container.kill()                    a command that outlived its kill (the sandbox closes)
    container.pause(); container.unpause()                              paused()
    container.remove(force=True)                                        close()

`docker exec` has no timeout of its own: `gyre.sandboxes.docker_exec` bounds each command (a timed-out agent
command's processes are killed by its token; only if that fails is the whole container killed and the sandbox
closed, the workspace kept).
What a container is made of (`container_kwargs`, pure; the slots; `engine_problem()`, which says
before a run starts why no container could be started here) is `gyre.sandboxes.docker_container`;
the SDK is imported only when a container is really started.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gyre.records import Query
from gyre.sandboxes import file_tools
from gyre.sandboxes.agent_index import AGENT_INDEX_DIR, AGENT_INDEX_SLOT, AgentIndex
from gyre.sandboxes.base import ExecResult, SandboxLimits, SandboxLostError, SandboxStartError
from gyre.sandboxes.bridge import ProxyBridge, proxy_address
from gyre.sandboxes.docker_container import (
    BRIDGE_SLOT, DEFAULT_WORKDIR, SLOTS_SUFFIX, cgroup_parent, container_kwargs, container_name,
    engine_answers, engine_call, evaluation_user,
    make_slots, requested_image,
)
from gyre.sandboxes.docker_build import seed_workspace
from gyre.sandboxes.docker_exec import EXEC_ENV, bounded_exec, kill_execs, signal_user
from gyre.sandboxes.packages_image import execution_image
from gyre.sandboxes.swe_image import EnvironmentRecipe
from gyre.sandboxes.fdwalk import strip_special_bits
from gyre.sandboxes.git_history import strip_git_history
from gyre.sandboxes.paths import remove_tree

log = logging.getLogger(__name__)

STOP_WAIT_S = 10.0
"""How long a command may take to end after its processes were sent SIGKILL."""
NO_PYTHON3 = (
    "command -v python3 >/dev/null 2>&1 || { echo 'gyre: this image has no python3, which the proxy bridge "
    "needs inside the container (gyre.sandboxes.bridge): use an image with python3, or harness.type: "
    "builtin' >&2; exit 127; }; "
)


def _cgroupfs(client) -> bool:
    """Does the engine place cgroups itself (`cgroupfs`, where `cgroup_parent` is a path) rather than
    through systemd (where it must name a slice, and its own placement stands)?"""
    return client.info().get("CgroupDriver") == "cgroupfs"


@dataclass
class DockerSandbox:
    workspace: Path
    container: Any
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    workdir: str = DEFAULT_WORKDIR
    slot_root: Path | None = None
    """Host directory of the bridge and evaluation slots (next to the workspace, never scored)."""
    eval_slots: dict[str, str] = field(default_factory=dict)
    """Evaluation slots, name -> path inside (their host directories: `slot(name)`)."""
    eval_user: tuple[int, int] = field(default_factory=evaluation_user)
    image: str | None = None
    """What `executions.image` records: the image, or `requested -> used` (`resolve_image`)."""
    image_ref: str = ""
    """The image the container runs from (a tag or id on this engine): what a control run starts again."""
    cgroup_parent_name: str = ""
    """`sandbox.docker.cgroup_parent` as created with (a control run's container goes under it too)."""
    closed: bool = field(default=False, init=False)
    restarts: int = field(default=0, init=False)
    """Times the container was found stopped and started again (`ensure_running`)."""
    _running: set[str] = field(default_factory=set, init=False)
    _running_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _bridge: ProxyBridge | None = field(default=None, init=False)
    _agent_index: AgentIndex | None = field(default=None, init=False)

    @classmethod
    def create(
        cls,
        query: Query,
        workspace: Path,
        env: Mapping[str, str] | None = None,
        limits: SandboxLimits | None = None,
        *,
        image: str | None = None,
        workdir: str | None = None,
        eval_slots: Mapping[str, str] | None = None,
        agent_dirs: Iterable[str] = (),
        base_images: Mapping[str, str] | None = None,
        cgroup_parent_name: str = "",
        dockerfile: str | None = None,
        build_timeout_s: float = 1800.0,
        build_network: str = "none",
        pull: bool = False,
        index_url: str | None = None,
        agent_index: bool = False,
        packages: tuple[str, ...] = (),
        is_project: Callable[[str, list[str]], bool] | None = None,
        recipe: EnvironmentRecipe | None = None,
    ) -> DockerSandbox:
        """`base_images`: `sandbox.docker.base_images` (`resolve_image`); `cgroup_parent_name`: the cgroup made
        under gyre's own memory cgroup for the container (`sandbox.docker.cgroup_parent`; engines with the
        cgroupfs driver: one on systemd's keeps its own placement). `dockerfile`: the task's own, built
        (`docker_build.container_image`: when there is no `image`, or it is not on the engine and not pulled) and
        run; `packages`: what the task's image holds on top, never the project itself (`is_project`; NL2RepoBench,
        `packages_image`); `recipe`: a SWE-bench instance's images, built instead (`swe_image`).
        The workspace starts from the query's `start/` with what the image holds at `workdir` around it
        (`docker_build.seed_workspace`), git history past the start commit stripped."""
        import docker  # the optional extra, imported only here

        workspace = Path(workspace).resolve()
        if workspace.exists() and any(workspace.iterdir()):
            raise FileExistsError(f"workspace {workspace} already exists and is not empty")
        workspace.mkdir(parents=True, exist_ok=True)
        if query.start_dir is not None:
            shutil.copytree(query.start_dir, workspace, symlinks=True, dirs_exist_ok=True)
        limits = limits or SandboxLimits()
        workdir = workdir or DEFAULT_WORKDIR
        slot_root = workspace.parent / f".{workspace.name}{SLOTS_SUFFIX}"
        remove_tree(slot_root)
        owner = evaluation_user()
        binds = make_slots(slot_root, dict(eval_slots or {}), agent_dirs, owner)
        env, route = dict(env or {}), None
        try:
            if agent_index:  # the agent's own route to the package index (`agent_index`)
                route = AgentIndex.open(slot_root / AGENT_INDEX_SLOT, index_url, query.query_id)
                binds.append((route.bridge.directory, AGENT_INDEX_DIR, "ro"))
                env.update(route.env())
            with engine_answers():
                client = docker.from_env()
                used, note = execution_image(client, query.query_id, requested_image(image, dockerfile), dockerfile,
                                             base_images or {},
                                             build_timeout_s, build_network, pull, index_url, packages, workdir,
                                             is_project, recipe)
                left_out = seed_workspace(client, used, workdir, workspace)  # the bind mount hides its workdir
                if left_out:
                    note += f"; left out of the workspace: {', '.join(left_out[:5])}"
                if query.start_dir is not None:
                    strip_git_history(workspace)
                cgroup = cgroup_parent(cgroup_parent_name) if cgroup_parent_name and _cgroupfs(client) else None
                kwargs = container_kwargs(used, workspace, workdir, limits, env, f"gyre-{workspace.name}",
                                          binds, cgroup)
                container = client.containers.run(**kwargs)
                if route is not None:
                    route.start_inside(container)
        except (docker.errors.DockerException, SandboxLostError) as exc:  # the engine refused or died: not the agent's
            _abandon(slot_root, route)
            raise SandboxStartError(f"the container did not start: {exc}") from exc
        except BaseException:
            _abandon(slot_root, route)
            raise
        box = cls(workspace=workspace, container=container, limits=limits, workdir=workdir, slot_root=slot_root,
                  eval_slots=dict(eval_slots or {}), eval_user=owner, image=note, image_ref=used,
                  cgroup_parent_name=cgroup_parent_name)
        box._agent_index = route
        return box

    @classmethod
    def around(cls, directory: Path, image: str, workdir: str, eval_slots: Mapping[str, str],
               limits: SandboxLimits, cgroup_parent_name: str = "") -> DockerSandbox:
        """A container of `image` (on the engine: nothing is built or pulled) on `directory` as it is, at
        `workdir`, with evaluation slots and no agent: where an evaluation that upstream runs in a fresh container
        of the task's image runs (NL2RepoBench). Its slots lie beside `directory`."""
        import docker

        directory = Path(directory).resolve()
        slot_root = directory.parent / f".{directory.name}{SLOTS_SUFFIX}"
        owner = evaluation_user()
        binds = make_slots(slot_root, dict(eval_slots), (), owner)
        try:
            with engine_answers():
                client = docker.from_env()
                cgroup = cgroup_parent(cgroup_parent_name) if cgroup_parent_name and _cgroupfs(client) else None
                name = f"gyre-eval-{secrets.token_hex(6)}"
                container = client.containers.run(**container_kwargs(image, directory, workdir, limits, {}, name,
                                                                     binds, cgroup))
        except (docker.errors.DockerException, SandboxLostError) as exc:
            _abandon(slot_root, None)
            raise SandboxStartError(f"the container did not start: {exc}") from exc
        box = cls(workspace=directory, container=container, limits=limits, workdir=workdir, slot_root=slot_root,
                  eval_slots=dict(eval_slots), eval_user=owner, image=image, image_ref=image,
                  cgroup_parent_name=cgroup_parent_name)
        box.end_agent()
        return box

    def slot(self, name: str) -> Path:
        """The host directory of evaluation slot `name`."""
        if name not in self.eval_slots or self.slot_root is None:
            raise KeyError(f"no evaluation slot {name!r} was mounted at creation")
        return self.slot_root / name

    def exec(self, command: str, timeout_s: float) -> ExecResult:
        """An agent command (the image's user); on timeout its processes are killed, the container stays."""
        with engine_answers():
            return self._exec(command, timeout_s)

    def _exec(self, command: str, timeout_s: float) -> ExecResult:
        self._check_open()
        token = secrets.token_hex(8)
        with self._running_lock:
            self._running.add(token)
        try:
            return self._bounded(["bash", "-c", command], {"workdir": self.workdir, "environment": {EXEC_ENV: token}},
                                 timeout_s, [(lambda: self._kill_execs([token]), STOP_WAIT_S)])
        finally:
            with self._running_lock:
                self._running.discard(token)

    def run_as(self, command: str, *, user: str, env: Mapping[str, str], timeout_s: float,
               interrupt_grace_s: float = 5.0, max_output_bytes: int | None = None) -> ExecResult:
        """An evaluation command as `user` ("uid:gid"): on timeout SIGINT (pytest still reports), SIGKILL
        after `interrupt_grace_s`; afterwards every process of `user` is killed (what the tests left)."""
        with engine_answers():
            return self._run_as(command, user=user, env=env, timeout_s=timeout_s, interrupt_grace_s=interrupt_grace_s,
                                max_output_bytes=max_output_bytes)

    def _run_as(self, command: str, *, user: str, env: Mapping[str, str], timeout_s: float,
                interrupt_grace_s: float, max_output_bytes: int | None) -> ExecResult:
        self._check_open()
        stops = [(lambda: self._signal_user(user, "INT"), interrupt_grace_s),
                 (lambda: self._signal_user(user, "KILL"), STOP_WAIT_S)]
        try:
            return self._bounded(["bash", "-c", command], {"user": user, "workdir": self.workdir,
                                                           "environment": dict(env)},
                                 timeout_s, stops, max_output_bytes)
        finally:
            if not self.closed:
                self._signal_user(user, "KILL")

    def ensure_running(self) -> bool:
        """Start the container again if it stopped (OOM, the engine); True then: what ran in it is gone."""
        self._check_open()
        with engine_answers():
            engine_call(self.container.reload)
            if self.container.status == "running":
                return False
            engine_call(self.container.start)
        self.restarts += 1
        return True

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Every process of the container frozen for a block (`docker pause`: the cgroup freezer), so
        root work on its workspace from the host (an in-container evaluation's ACL grant) happens while
        nothing of the agent runs."""
        self._check_open()
        with engine_answers():
            engine_call(self.container.pause)
        try:
            yield
        finally:
            with engine_answers():
                engine_call(self.container.unpause)

    def end_agent(self) -> None:
        """The agent is done: its commands still running are killed and its proxy route closed; the
        container and what the agent left running in it stay for the evaluation (then `close()`)."""
        with self._running_lock:
            running = sorted(self._running)
        try:
            if running and not self.closed:
                with engine_answers():
                    self._kill_execs(running)
        finally:
            self._close_bridge()

    def open_proxy(self, base_url: str) -> str:
        """Let commands reach the proxy at `base_url` (and nothing else); returns a shell prefix for them:
        it fails the command at once, saying why, when the image has no python3."""
        self._check_open()
        target = proxy_address(base_url)
        if self._bridge is None:
            if self.slot_root is None:
                raise RuntimeError("this container was created without a bridge directory")
            self._bridge = ProxyBridge(target, self.slot_root / BRIDGE_SLOT).start()
        elif self._bridge.target != target:
            raise ValueError(f"sandbox already bridged to {self._bridge.target}, not {base_url}")
        return NO_PYTHON3 + self._bridge.shell_prefix()

    def read_file(self, rel: str) -> str:
        """A workspace file's text, read by `cat` in the container as the image's user (never from the
        host: the agent's processes could swap a path for a link meanwhile; `gyre.sandboxes.file_tools`)."""
        return file_tools.read_file(self.exec, rel, self.limits.max_output_bytes)

    def write_file(self, rel: str, content: str) -> None:
        """Write a workspace file by commands in the container as the image's user (`gyre.sandboxes.file_tools`)."""
        file_tools.write_file(self.exec, rel, content, stdin=False)

    def close(self) -> None:
        self._close_bridge()
        if self.container is not None:
            try:
                with engine_answers():
                    self.container.remove(force=True)
            except SandboxLostError as exc:  # deliberate: nothing to remove it with; its slots go all the same
                log.warning("docker sandbox %s: its container %s could not be removed (%s); the engine keeps it, "
                            "labelled gyre, until it answers again", self.workspace, container_name(self.container),
                            exc)
            finally:
                self.container = None
                if self.slot_root is not None:
                    remove_tree(self.slot_root)
                try:  # the container is gone: nothing it marked setuid stays runnable on the host
                    strip_special_bits(self.workspace)
                except PermissionError as exc:  # deliberate: gyre not root, a file of the container's root
                    log.warning("docker sandbox %s: a setuid or setgid file the container left could not be "
                                "cleared (%s); keep the workspace from other users", self.workspace, exc)
        self.closed = True

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.workspace)

    # -- internals ---------------------------------------------------------------------

    def _bounded(self, argv: list[str], kwargs: dict[str, Any], timeout_s: float,
                 stops: list[tuple[Callable[[], None], float]], max_output_bytes: int | None = None) -> ExecResult:
        """`bounded_exec` in this container; a command outliving every stop step killed the container: the
        sandbox is closed."""
        result, survived = bounded_exec(self.container, argv, kwargs, timeout_s, stops, self.workspace, self.limits,
                                        max_output_bytes)
        if not survived:
            self.closed = True
        return result

    def _kill_execs(self, tokens: Sequence[str]) -> None:
        kill_execs(self.container, tokens)

    def _signal_user(self, user: str, signal_name: str) -> None:
        signal_user(self.container, user, signal_name)

    def _close_bridge(self) -> None:
        """The agent's routes out: to the model proxy, and to the package index when it had one."""
        if self._bridge is not None:
            self._bridge.close()
            self._bridge = None
        if self._agent_index is not None:
            self._agent_index.close()
            self._agent_index = None

    def _check_open(self) -> None:
        if self.closed or self.container is None:
            raise RuntimeError(f"sandbox for {self.workspace} is closed")


def _abandon(slot_root: Path, route: AgentIndex | None) -> None:
    """What a container that did not start leaves: its slots, the agent's index route."""
    if route is not None:
        route.close()
    remove_tree(slot_root)
