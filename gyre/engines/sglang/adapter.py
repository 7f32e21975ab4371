"""The SGLang rollout engine: the `RolloutEngine` interface over one SGLang server's HTTP API.

On a cluster each rollout cell runs one SGLang server (`python -m sglang.launch_server
--model-path <hf dir> --skip-tokenizer-init ...`, installed with `gyre-rl[sglang]`); this
adapter is how gyre talks to it. It speaks HTTP only (httpx), so it never imports
`sglang` and works from the base install. Written from SGLang 0.5.23's source (the PyPI
wheel `sglang-0.5.23`: `srt/entrypoints/http_server.py`, `srt/managers/io_struct.py`,
`srt/managers/tokenizer_manager.py`, `srt/layers/sampler.py`, `api/v1/api_types.py`).

Endpoints and fields relied on:
- `POST /generate`, plain or streamed (SSE): its request and answer fields, the streaming
  format and the top_p/top_k log-prob fields are in `gyre.engines.sglang.wire`, which builds
  and reads them.
- `POST /abort_request {rid}`; `POST /pause_generation {mode}`, `POST
  /continue_generation {}`; `POST /update_weights_from_disk {model_path, weight_version,
  flush_cache}` -> `{success, message, num_paused_requests}`; `POST /flush_cache`;
  `GET /health_generate` (200 healthy, 503 not); `GET /model_info` (`/get_model_info` on
  servers before its rename); `GET /v1/models` (`data[0].max_model_len` is the context).

Semantics, matching the torch reference engine: `pause()` lets requests in flight finish,
holds new ones in the adapter, then pauses the server (mode "in_place": nothing runs, so
nothing is held mid-request); `drain()` refuses new requests and waits for queued and
running ones (a paused engine runs its queue); `resume()` undoes both. A set stop event
sends `/abort_request` (at the next streamed token, or from the watcher thread within
`ABORT_POLL_S` when no token comes) and returns the tokens `on_token` has seen with
`finish_reason == "abort"`. When the server cannot be reached (a network partition: no
chunk arrives and the abort goes unanswered), the watcher shuts the stream's socket
`STOP_GRACE_S` after the stop, so a drain never waits on a dead link. A weight update names the version (`weight_version`), so each
result carries the version the server reports; SGLang's update waits for requests in
flight, so one request never spans two versions unless the server is paused mid-request
by someone else.

Only a GPU run with a real SGLang server verifies: that its log-probs equal the torch
reference's for the same weights (temperature 1, and truncated with top_p/top_k through
`output_token_sampling_logprobs`); that `/update_weights_from_disk` loads gyre's snapshot
layout (HF config + `model.safetensors` with HF tensor names); abort latency and that an
abort of a request held by a paused server ends its stream; timing of pause/continue and
weight updates; `/health_generate` behaviour under load; the cost of streaming (each
cumulative chunk resends all log-probs so far; the server's `--stream-interval` thins them)
and of `return_sampling_mask` (it also returns each token's support). The tests use a fake
written from the same source (`tests/sglang_fake.py`).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import httpx

from gyre.engines.base import ContextLengthError, EngineDrainingError, GenerationRequest, GenerationResult
from gyre.engines.sglang.wire import (
    TOP_K_ALL,
    SGLangError,
    cut_stream,
    endpoint_error,
    error_message,
    finish_kind,
    generate_payload,
    output_tokens,
    stream_chunks,
)

__all__ = [  # TOP_K_ALL and SGLangError live in sglang_wire and are re-exported here
    "SGLangRolloutEngine", "SGLangError", "TOP_K_ALL", "CONNECT_RETRIES", "RETRY_BACKOFF_S", "ABORT_POLL_S",
    "ABORT_TIMEOUT_S", "STOP_GRACE_S", "HEALTH_POLL_S", "CONNECT_TIMEOUT_S", "PAUSE_MODE",
]

CONNECT_RETRIES = 3  # a request that never reached the server is safe to send again
RETRY_BACKOFF_S = 0.25  # first wait between connect retries; doubles each time
ABORT_POLL_S = 0.02  # how often the watcher looks at in-flight requests' stop events
ABORT_TIMEOUT_S = 5.0  # an /abort_request unanswered this long is given up (the server is unreachable)
STOP_GRACE_S = 10.0  # a stopped stream with no chunk for this long is cut: its tokens so far are the result
HEALTH_POLL_S = 0.5  # wait_healthy's poll interval
CONNECT_TIMEOUT_S = 10.0
PAUSE_MODE = "in_place"  # nothing runs when the adapter pauses the server (see pause())
_WEIGHT_FILES = (".safetensors", ".safetensors.index.json", ".bin", ".pt")


class SGLangRolloutEngine:
    """`RolloutEngine` over one SGLang server (one per rollout cell)."""

    def __init__(self, base_url: str, engine_id: str = "sglang-0", *, policy_version: int = 0,
                 base_model_dir: Path | None = None, context_length: int | None = None,
                 timeout_s: float = 600.0) -> None:
        self.engine_id = engine_id
        self.base_url = base_url.rstrip("/")
        self.base_model_dir = Path(base_model_dir) if base_model_dir is not None else None
        self._context_length = context_length
        self._version = policy_version
        self._client = httpx.Client(base_url=self.base_url,
                                    timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S))
        self._cond = threading.Condition()
        self._pending = 0  # requests admitted (queued in the adapter or at the server)
        self._inflight = 0  # requests sent to the server
        self._paused = False
        self._server_paused = False
        self._draining = False
        self._watched: dict[str, threading.Event] = {}  # rid -> stop event of streaming requests
        self._streams: dict[str, httpx.Response] = {}  # rid -> its open stream (the watcher may cut it)
        self._stopped_at: dict[str, float] = {}  # rid -> when the watcher first saw its stop event set
        self._abort_sent: set[str] = set()
        self._closed = threading.Event()
        self._watcher = threading.Thread(target=self._watch_stops, name=f"{engine_id}-aborts", daemon=True)
        self._watcher.start()

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def context_length(self) -> int:
        if self._context_length is None:
            cards = self._call("GET", "/v1/models").json()["data"]
            self._context_length = int(cards[0]["max_model_len"])
        return self._context_length

    @property
    def max_context(self) -> int:
        """The `RolloutEngine` name of `context_length`."""
        return self.context_length

    # -- generation -----------------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> GenerationResult:
        context = self.context_length
        if len(request.prompt_ids) >= context:
            raise ContextLengthError(f"prompt has {len(request.prompt_ids)} tokens; the model's context is {context}")
        with self._cond:
            if self._draining:
                raise EngineDrainingError(f"engine {self.engine_id} is draining")
            self._pending += 1
        try:
            if not self._wait_turn(request):
                return self._result([], [], "abort", None)
            try:
                return self._generate(request, context - len(request.prompt_ids))
            finally:
                with self._cond:
                    self._inflight -= 1
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def _wait_turn(self, request: GenerationRequest) -> bool:
        """Hold the request while paused; False if its stop event was set meanwhile."""
        with self._cond:
            while self._paused and not self._draining:
                if request.stop is not None and request.stop.is_set():
                    return False
                self._cond.wait(ABORT_POLL_S)
            if request.stop is not None and request.stop.is_set():
                return False
            self._inflight += 1
            return True

    def _generate(self, request: GenerationRequest, room: int) -> GenerationResult:
        rid = f"{self.engine_id}-{uuid.uuid4().hex}"
        payload, truncating = generate_payload(rid, request, room)
        if request.stop is None and request.on_token is None:
            chunk = self._call("POST", "/generate", json=payload).json()
            ids, logprobs = output_tokens(chunk, truncating, self.base_url)
            return self._result(ids, logprobs, finish_kind(chunk, self.base_url), chunk["meta_info"])
        payload["stream"] = True
        if request.stop is not None:
            with self._cond:
                self._watched[rid] = request.stop
        try:
            return self._stream(payload, request, truncating)
        finally:
            with self._cond:
                self._watched.pop(rid, None)
                self._streams.pop(rid, None)
                self._stopped_at.pop(rid, None)
                self._abort_sent.discard(rid)

    def _stream(self, payload: dict, request: GenerationRequest, truncating: bool) -> GenerationResult:
        rid, seen_ids, seen_lps = payload["rid"], [], []
        stopped = lambda: request.stop is not None and request.stop.is_set()  # noqa: E731
        response = self._open_stream(payload)
        with self._cond:
            self._streams[rid] = response
        try:
            for chunk in stream_chunks(response, stopped, self.base_url):
                ids, logprobs = output_tokens(chunk, truncating, self.base_url)
                for token_id, logprob in zip(ids[len(seen_ids):], logprobs[len(seen_ids):]):
                    if stopped():  # checked at each token boundary, as the torch engine does
                        break
                    seen_ids.append(token_id)
                    seen_lps.append(logprob)
                    if request.on_token is not None:
                        request.on_token(token_id, logprob)
                if stopped():
                    self.abort(rid)
                    return self._result(seen_ids, seen_lps, "abort", chunk["meta_info"])
                if chunk["meta_info"].get("finish_reason") is not None:
                    return self._result(seen_ids, seen_lps, finish_kind(chunk, self.base_url), chunk["meta_info"])
            if stopped():  # cut by the watcher: the server never answered the stop
                return self._result(seen_ids, seen_lps, "abort", None)
        finally:
            response.close()
        raise SGLangError(self.base_url, "/generate", response.status_code,
                          f"stream for {rid} ended without a finish_reason after {len(seen_ids)} tokens")

    def _open_stream(self, payload: dict):
        """Open the SSE stream (connect retries as in `_call`); the caller closes it."""
        for attempt in range(CONNECT_RETRIES + 1):
            try:
                response = self._client.send(self._client.build_request("POST", "/generate", json=payload),
                                             stream=True)
                break
            except httpx.ConnectError as exc:
                if attempt == CONNECT_RETRIES:
                    raise SGLangError(self.base_url, "/generate", None, str(exc)) from exc
                time.sleep(RETRY_BACKOFF_S * 2**attempt)
        if response.status_code != 200:
            response.read()
            response.close()
            self._raise(response, "/generate")
        return response

    def _result(self, ids: list[int], logprobs: list[float], finish: str, meta: dict | None) -> GenerationResult:
        version = self._version
        reported = (meta or {}).get("weight_version")
        if isinstance(reported, str) and reported.lstrip("-").isdigit():
            version = int(reported)
        return GenerationResult(list(ids), list(logprobs), finish, version, self.engine_id)

    def abort(self, rid: str) -> None:
        """Ask the server to end request `rid` (once); its stream then ends with an abort."""
        with self._cond:
            if rid in self._abort_sent:
                return
            self._abort_sent.add(rid)
        self._call("POST", "/abort_request", json={"rid": rid}, timeout_s=ABORT_TIMEOUT_S)

    def _watch_stops(self) -> None:
        """Abort streaming requests whose stop event is set while no token arrives; cut the
        stream of one still open `STOP_GRACE_S` after its stop (the server is unreachable)."""
        while not self._closed.wait(ABORT_POLL_S):
            now = time.monotonic()
            with self._cond:
                stopped = [rid for rid, stop in self._watched.items() if stop.is_set()]
                for rid in stopped:
                    self._stopped_at.setdefault(rid, now)
                overdue = [self._streams[rid] for rid in stopped
                           if rid in self._streams and now - self._stopped_at[rid] > STOP_GRACE_S]
                due = [rid for rid in stopped if rid not in self._abort_sent]
            for response in overdue:
                cut_stream(response)
            for rid in due:
                try:
                    self.abort(rid)
                except (SGLangError, httpx.HTTPError):
                    pass  # the stream's own reader sees the stop event at its next chunk, or is cut

    # -- control --------------------------------------------------------------------------

    def load_weights(self, snapshot: Path, version: int) -> None:
        """Load `snapshot` with `/update_weights_from_disk`; the version changes only on success."""
        model_path = self._model_dir_for(Path(snapshot))
        body = {"model_path": str(model_path), "weight_version": str(version), "flush_cache": True}
        answer = self._call("POST", "/update_weights_from_disk", json=body).json()
        if not answer.get("success"):
            raise SGLangError(self.base_url, "/update_weights_from_disk", 200, answer.get("message", repr(answer)))
        self._version = version

    def _model_dir_for(self, snapshot: Path) -> Path:
        """SGLang loads an HF directory: a snapshot directory as is; a single safetensors file
        next to the base model's config and tokenizer files (symlinked into `<file>.sglang/`)."""
        if snapshot.is_dir():
            return snapshot
        if not snapshot.is_file():
            raise FileNotFoundError(f"snapshot {snapshot} does not exist")
        if self.base_model_dir is None:
            raise ValueError(f"snapshot {snapshot} is a single weights file: SGLang needs an HF directory, "
                             "so give the engine base_model_dir (the model the server was launched with)")
        staged = snapshot.parent / f"{snapshot.name}.sglang"
        staged.mkdir(exist_ok=True)
        for item in self.base_model_dir.iterdir():
            if item.is_file() and not item.name.endswith(_WEIGHT_FILES):
                _symlink(staged / item.name, item.resolve())
        _symlink(staged / "model.safetensors", snapshot.resolve())
        return staged

    def pause(self) -> None:
        """Let requests in flight finish, hold new ones, then pause the server."""
        with self._cond:
            self._paused = True
            self._cond.wait_for(lambda: self._inflight == 0)
        self._call("POST", "/pause_generation", json={"mode": PAUSE_MODE})
        self._server_paused = True

    def resume(self) -> None:
        if self._server_paused:
            self._call("POST", "/continue_generation", json={})
            self._server_paused = False
        with self._cond:
            self._paused = self._draining = False
            self._cond.notify_all()

    def drain(self, timeout_s: float | None = None) -> bool:
        with self._cond:
            self._draining = True
        if self._server_paused:  # a paused engine must run its queue to drain it
            self._call("POST", "/continue_generation", json={})
            self._server_paused = False
        with self._cond:
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def health(self) -> bool:
        """True if the server generates (`/health_generate` 200), False if it answers 503."""
        response = self._call("GET", "/health_generate", ok=(200, 503))
        return response.status_code == 200

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                if self.health():
                    return
                last = "HTTP 503"
            except SGLangError as exc:
                last = str(exc)
            time.sleep(HEALTH_POLL_S)
        raise SGLangError(self.base_url, "/health_generate", None, f"not healthy within {timeout_s} s (last: {last})")

    def flush_cache(self) -> None:
        """Empty the server's radix (prefix) cache; SGLang refuses while requests run."""
        self._call("POST", "/flush_cache")

    def model_info(self) -> dict:
        response = self._call("GET", "/model_info", ok=(200, 404))
        if response.status_code == 404:  # servers before /model_info existed
            response = self._call("GET", "/get_model_info")
        return response.json()

    def close(self) -> None:
        self._closed.set()
        self._watcher.join(timeout=5)
        self._client.close()

    # -- HTTP -----------------------------------------------------------------------------

    def _call(self, method: str, endpoint: str, *, json: dict | None = None, ok: tuple[int, ...] = (200,),
              timeout_s: float | None = None) -> httpx.Response:
        extra = {"timeout": httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S))} if timeout_s else {}
        for attempt in range(CONNECT_RETRIES + 1):
            try:
                response = self._client.request(method, endpoint, json=json, **extra)
                break
            except httpx.ConnectError as exc:
                if attempt == CONNECT_RETRIES:
                    raise SGLangError(self.base_url, endpoint, None, str(exc)) from exc
                time.sleep(RETRY_BACKOFF_S * 2**attempt)
            except httpx.HTTPError as exc:  # sent, answer lost: not retried (it may have run)
                raise SGLangError(self.base_url, endpoint, None, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code not in ok:
            self._raise(response, endpoint)
        return response

    def _raise(self, response: httpx.Response, endpoint: str) -> None:
        try:
            message = error_message(response.json())
        except ValueError:
            message = response.text.strip() or response.reason_phrase
        raise endpoint_error(self.base_url, endpoint, response.status_code, message)


def _symlink(link: Path, target: Path) -> None:
    if link.is_symlink() or link.exists():
        if link.resolve() == target:
            return
        link.unlink()
    link.symlink_to(target)
