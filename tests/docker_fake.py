"""A fake docker SDK for unit tests: the calls gyre makes are recorded and checked against the real SDK's
signatures (`Container.exec_run`, `ContainerCollection.run`'s argument conversion), and bind mounts
are emulated by path substitution so an evaluation command can really run on this host.

Nothing here starts a container or signals a process: `exec_run` runs only what a test's handler
runs; gyre's own kill commands (`kill -s SIG -1`, `KILL_EXECS`) are recorded, never executed.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import types
from collections.abc import Callable
from pathlib import Path

try:  # the real SDK (the `docker` extra), imported before any test replaces it in sys.modules
    from docker.models.containers import Container as SDKContainer
    from docker.models.containers import _create_container_args
except ImportError:  # pragma: no cover - without the extra only the fakes' own shape is checked
    SDKContainer = _create_container_args = None

Handler = Callable[["FakeContainer", list, dict], tuple[int, bytes, bytes]]


def check_run_kwargs(kwargs: dict) -> None:
    """What `client.containers.run(**kwargs)` would send: the SDK's own conversion (raises on unknown names)."""
    if _create_container_args is None:
        return
    args = dict(kwargs)
    args.pop("detach", None)
    args["version"] = "1.45"
    _create_container_args(args)


class Engine:
    """The fake engine's state: `down` (it died: every call raises what the SDK raises then, the connection to
    its socket refused)."""

    def __init__(self) -> None:
        self.down = False

    def answer(self) -> None:
        if self.down:
            import requests

            raise requests.exceptions.ConnectionError(
                "('Connection aborted.', FileNotFoundError(2, 'No such file or directory'))")


class FakeContainer:
    def __init__(self, kwargs: dict, handler: Handler | None = None, engine: Engine | None = None) -> None:
        self.engine = engine or Engine()
        self.kwargs = kwargs
        self.handler = handler
        self.calls: list[tuple[list, dict]] = []
        self.status = "running"
        self.starts = self.kills = 0
        self.removed = False
        binds = [(v["bind"], Path(h)) for h, v in kwargs["volumes"].items()]
        self.binds = sorted(binds, key=lambda b: -len(b[0]))

    def exec_run(self, cmd, **kw):
        if SDKContainer is not None:
            inspect.signature(SDKContainer.exec_run).bind(self, cmd, **kw)  # the SDK's names only
        self.engine.answer()
        self.calls.append((list(cmd), kw))
        exit_code, out, err = self.handler(self, list(cmd), kw) if self.handler else (0, b"", b"")
        return types.SimpleNamespace(exit_code=exit_code, output=(out, err) if kw.get("demux") else out + err)

    def pause(self) -> None:
        self.engine.answer()
        self.calls.append((["<pause>"], {}))
        self.status = "paused"

    def unpause(self) -> None:
        self.engine.answer()
        self.calls.append((["<unpause>"], {}))
        self.status = "running"

    def host(self, inside: str) -> Path:
        """The host path a bind shows at `inside`."""
        for bind, host in self.binds:
            if inside == bind or inside.startswith(bind + "/"):
                return host / inside[len(bind):].lstrip("/")
        raise FileNotFoundError(f"{inside} is in no bind of this container")

    def translate(self, text: str) -> str:
        """`text` with every bind's inside path replaced by its host path."""
        for bind, host in self.binds:
            text = re.sub(re.escape(bind) + r"(?=/|\b|$)", str(host).replace("\\", "\\\\"), text)
        return text

    def reload(self) -> None:
        self.engine.answer()

    def start(self) -> None:
        self.engine.answer()
        self.status, self.starts = "running", self.starts + 1

    def kill(self) -> None:
        self.engine.answer()
        self.status, self.kills = "exited", self.kills + 1

    def remove(self, force: bool = False) -> None:
        self.engine.answer()
        self.removed = True


def fake_sdk(handler: Handler | None = None) -> tuple[types.ModuleType, list[FakeContainer]]:
    """A `docker` module whose `from_env().containers.run(**kwargs)` makes FakeContainers; `module.engine.down =
    True` kills its engine (every call then raises)."""
    made: list[FakeContainer] = []
    engine = Engine()

    def run(**kwargs):
        engine.answer()
        check_run_kwargs(kwargs)
        made.append(FakeContainer(kwargs, handler, engine))
        return made[-1]

    class DockerException(Exception):
        pass

    class ImageNotFound(DockerException):
        pass

    class NotFound(DockerException):
        pass

    def create(image, **kwargs):
        """A stopped container of `image` for `seed_workspace`: the fake's images hold no files."""
        engine.answer()

        def get_archive(path):
            raise NotFound(f"{image} holds no {path}")
        return types.SimpleNamespace(get_archive=get_archive, remove=lambda force=False: None)

    module = types.ModuleType("docker")
    module.engine = engine
    module.errors = types.SimpleNamespace(DockerException=DockerException, ImageNotFound=ImageNotFound,
                                          NotFound=NotFound)
    module.from_env = lambda **_: types.SimpleNamespace(containers=types.SimpleNamespace(run=run, create=create),
                                                          images=types.SimpleNamespace(get=lambda name: name),
                                                          info=lambda: {"CgroupDriver": "cgroupfs"})
    return module, made


def run_script(container: FakeContainer, cmd: list, kw: dict) -> tuple[int, bytes, bytes]:
    """Run an evaluation command (`bash <script inside>`) on this host as the container would: paths
    in the script and environment translated to their binds' host paths, cwd the workdir's, the
    plugin's result lines relayed to the real FIFO with their paths translated back."""
    match = re.fullmatch(r"bash (\S+)", cmd[2])
    assert match, f"the fake runs only `bash <script>`, got {cmd[2]!r}"
    script = container.translate(container.host(match.group(1)).read_text())
    env = {k: container.translate(v) for k, v in kw["environment"].items()}
    fifo = Path(env.pop("GYRE_RESULT_PATH"))
    with tempfile.TemporaryDirectory() as tmp:
        inner = Path(tmp) / "inner.fifo"
        os.mkfifo(inner)
        read_fd = os.open(inner, os.O_RDONLY | os.O_NONBLOCK)
        keep_fd = os.open(inner, os.O_WRONLY)
        os.set_blocking(read_fd, True)
        relay = threading.Thread(target=_relay, args=(container, read_fd, fifo), daemon=True)
        relay.start()
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        try:
            done = subprocess.run(["bash", "-c", script], cwd=container.host(kw["workdir"]), capture_output=True,
                                  timeout=120, env={"PATH": path, **env, "GYRE_RESULT_PATH": str(inner)})
        finally:
            os.close(keep_fd)
            relay.join(30)
    return done.returncode, done.stdout, done.stderr


def _relay(container: FakeContainer, read_fd: int, fifo: Path) -> None:
    back = [(str(host), bind) for bind, host in container.binds]
    with os.fdopen(read_fd, "rb") as inner, open(fifo, "wb", buffering=0) as outer:
        for line in inner:
            message = json.loads(line)
            if isinstance(message.get("path"), str):
                for host, bind in back:
                    if message["path"].startswith(host + "/"):
                        message["path"] = bind + message["path"][len(host):]
                        break
            outer.write((json.dumps(message) + "\n").encode())


def write_lines(container: FakeContainer, kw: dict, messages: list[dict]) -> None:
    """What a process in the container writing on the result FIFO would do."""
    with open(container.host(kw["environment"]["GYRE_RESULT_PATH"]), "wb", buffering=0) as fifo:
        for message in messages:
            fifo.write((json.dumps(message) + "\n").encode())
