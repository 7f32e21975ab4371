"""A faithful fake of the SGLang HTTP server endpoints the SGLang rollout adapter uses.

SGLang cannot serve on our CPU machines, so the adapter is tested against this fake. It was
written from SGLang 0.5.23's own source (the PyPI wheel `sglang-0.5.23`:
`srt/entrypoints/http_server.py`, `srt/managers/io_struct.py`,
`srt/managers/tokenizer_manager.py`, `srt/managers/schedule_batch.py`,
`srt/sampling/sampling_params.py`, `api/v1/api_types.py`) and keeps its quirks:

- `/generate` answers `{"text", "output_ids", "meta_info"}`; `meta_info` carries `id` (the
  rid), `finish_reason` (null while running, then `{"type": "length", "length": N}`,
  `{"type": "stop", "matched": token_id}` or `{"type": "abort", "message": "Aborted",
  "status_code": null, "err_type": null}`), `prompt_tokens`, `completion_tokens`,
  `cached_tokens`, `weight_version` (a string, "default" until an update names one) and,
  with `return_logprob`, `output_token_logprobs` as `[logprob, token_id, text]` triples
  (text null unless `return_text_in_logprobs`) and `input_token_logprobs` (empty for
  `logprob_start_len == -1`, the default).
- Streaming (the default, non-incremental mode) sends cumulative chunks as SSE
  `data: {...}\\n\\n` lines (every chunk holds all output ids and log-probs so far) and ends
  with `data: [DONE]`. A stop token is kept in `output_ids`.
- Errors come in SGLang's shapes: the JSON contract gate's `{"error": "<text>"}`
  (serde-style text, e.g. an unknown `sampling_params` field), a handler's ValueError as
  `{"error": {"message": ...}}` (context length, bad sampling values; when streaming, a
  200 stream of one `data: {"error": {"message", "type", "code", "retryable"}}` line and
  `data: [DONE]`), and FastAPI's
  validation error rewritten to 400 `{"object": "error", "message", "type": "Bad Request",
  "param": null, "code": 400}` (a body that is not a JSON object).
- The context check: `len(input_ids) >= context_len` and `len + max_new_tokens >
  context_len` are 400s (SGLang's `validate_total_tokens` is on).
- `top_k` must be -1 (all) or >= 1, `top_p` in (0, 1]; temperature 0 is greedy.
- `/pause_generation` `{"mode": "abort" | "retract" | "in_place"}` (default "abort", which
  aborts everything in flight); while paused, new requests wait and running ones hold.
  `/continue_generation` releases them.
- `/update_weights_from_disk` `{"model_path", "weight_version", ...}` answers
  `{"success", "message", "num_paused_requests"}`, 400 when it fails; unless paused it
  waits for in-flight requests (SGLang's model-update writer lock).
- `/abort_request` `{"rid", "abort_all"}` answers an empty 200; `/flush_cache` is a text 200
  (400 while requests run); `/health` and `/health_generate` are empty 200 (503 while
  `unhealthy`); `/model_info` (and the deprecated `/get_model_info`) and `/v1/models`
  (`max_model_len` is the context length; `/model_info` has none).

Tokens are deterministic: `FakeSGLang.token(prompt, step, weight_version)` is the (token,
log-prob) the fake samples at each step, so a test knows exactly what must come back.
"""

from __future__ import annotations

import asyncio
import threading
import hashlib
import json
import math
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gyre.net.server_thread import ServerThread

SAMPLING_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width",
    "watermark", "choice",
)
TOP_K_ALL = 1 << 30


class FakeSGLang:
    """One fake SGLang server on 127.0.0.1; `start()` it, read `base_url`, `stop()` it."""

    def __init__(self, *, context_len: int = 64, vocab_size: int = 500, token_delay_s: float = 0.002,
                 model_path: str = "fake-org/fake-model") -> None:
        self.context_len = context_len
        self.vocab_size = vocab_size
        self.token_delay_s = token_delay_s
        self.model_path = model_path
        self.weight_version = "default"
        self.unhealthy = False
        self.fail_generate_status: int | None = None  # inject a server error on /generate
        self.refuse_versions_from: int | None = None  # /update_weights_from_disk of this version or later fails
        self.refuse_versions_to: int | None = None  # ... up to this one, exclusive (None: every later one)
        # as SGLang's does on a snapshot it cannot load (400, "Rolled back to the old weights.")
        self.cut_after: int | None = None  # a network partition: after this many tokens nothing more
        # arrives on any stream and /abort_request never answers, until `heal()`
        self._healed = threading.Event()
        self.calls: list[tuple[str, dict]] = []  # (path, JSON body) of every POST
        self.aborted: set[str] = set()
        self.paused = False
        self._running: dict[str, dict] = {}  # rid -> {"abort": bool}
        self._resume: asyncio.Event | None = None
        self._idle: asyncio.Condition | None = None
        self._thread: ServerThread | None = None
        self.app = Starlette(routes=[
            Route("/generate", self._generate, methods=["POST", "PUT"]),
            Route("/abort_request", self._abort, methods=["POST"]),
            Route("/pause_generation", self._pause, methods=["POST"]),
            Route("/continue_generation", self._continue, methods=["POST"]),
            Route("/update_weights_from_disk", self._update_weights, methods=["POST"]),
            Route("/flush_cache", self._flush_cache, methods=["GET", "POST"]),
            Route("/health", self._health, methods=["GET"]),
            Route("/health_generate", self._health, methods=["GET"]),
            Route("/model_info", self._model_info, methods=["GET"]),
            Route("/get_model_info", self._model_info, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> "FakeSGLang":
        self._thread = ServerThread(self.app, name="fake-sglang").start()
        return self

    def heal(self) -> None:
        """End the partition `cut_after` set up (streams and aborts go on)."""
        self._healed.set()

    def stop(self) -> None:
        self._healed.set()
        if self._thread is not None:
            self._thread.stop()

    @property
    def base_url(self) -> str:
        assert self._thread is not None and self._thread.port is not None
        return f"http://127.0.0.1:{self._thread.port}"

    @property
    def running(self) -> int:
        return len(self._running)

    @staticmethod
    def token(prompt: list[int], step: int, weight_version: str, vocab_size: int = 500) -> tuple[int, float]:
        """The deterministic (token id, log-prob) sampled at `step` after `prompt`."""
        digest = hashlib.sha256(f"{prompt}|{step}|{weight_version}".encode()).digest()
        token_id = int.from_bytes(digest[:4], "little") % vocab_size
        logprob = -0.01 - int.from_bytes(digest[4:8], "little") % 4000 / 1000.0
        return token_id, logprob

    def _events(self) -> tuple[asyncio.Event, asyncio.Condition]:
        if self._resume is None:  # created in the server's own event loop
            self._resume, self._idle = asyncio.Event(), asyncio.Condition()
            self._resume.set()
        return self._resume, self._idle

    # -- /generate ------------------------------------------------------------------------

    async def _generate(self, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        self.calls.append(("/generate", body))
        contract = _contract_error(body)
        if contract is not None:
            return JSONResponse({"error": contract}, status_code=400)
        if self.fail_generate_status is not None:
            return JSONResponse({"error": {"message": "injected failure"}}, status_code=self.fail_generate_status)
        try:
            job = self._admit(body)
        except ValueError as exc:
            if body.get("stream"):  # raised inside the stream: an error line in a 200 stream
                error = {"error": {"message": str(exc), "type": "invalid_request_error", "code": 400,
                                   "retryable": False}}
                lines = [b"data: " + json.dumps(error).encode() + b"\n\n", b"data: [DONE]\n\n"]
                return StreamingResponse(iter(lines), media_type="text/event-stream")
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)  # _create_error_response
        self._running[job["rid"]] = {"abort": False}  # a paused server holds it (abortable) until continued
        if not body.get("stream"):
            final = None
            async for chunk in self._run(job):
                final = chunk
            return JSONResponse(final)

        async def sse():
            async for chunk in self._run(job):
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    def _admit(self, body: dict) -> dict:
        input_ids = body.get("input_ids")
        if input_ids is None:
            raise ValueError("Either text, input_ids or input_embeds should be provided.")
        sp = dict(body.get("sampling_params") or {})
        temperature = float(sp.get("temperature", 1.0))
        top_p, top_k = float(sp.get("top_p", 1.0)), int(sp.get("top_k", TOP_K_ALL))
        max_new = int(sp.get("max_new_tokens", 128))
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a non-negative finite number, got {temperature}.")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
        if top_k < 1 and top_k != -1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
        if len(input_ids) >= self.context_len:
            raise ValueError(f"The input ({len(input_ids)} tokens) is longer than the "
                             f"model's context length ({self.context_len} tokens).")
        if len(input_ids) + max_new > self.context_len:
            raise ValueError(f"Requested token count exceeds the model's maximum context length of "
                             f"{self.context_len} tokens. You requested a total of {len(input_ids) + max_new} "
                             f"tokens: {len(input_ids)} tokens from the input messages and {max_new} tokens "
                             "for the completion. Please reduce the number of tokens in the input messages "
                             "or the completion to fit within the limit.")
        rid = body.get("rid") or hashlib.sha1(repr(body).encode()).hexdigest()
        truncating = temperature > 0 and (top_p < 1.0 or 0 < top_k < TOP_K_ALL)
        return {"rid": rid, "prompt": list(input_ids), "max_new": max_new, "stops": set(sp.get("stop_token_ids") or ()),
                "logprob": bool(body.get("return_logprob")), "mask": bool(body.get("return_sampling_mask")),
                "truncating": truncating, "stream": bool(body.get("stream"))}

    async def _run(self, job: dict):
        resume, idle = self._events()
        rid = job["rid"]
        state = self._running[rid]
        ids: list[int] = []
        entries: list[list] = []
        mask_ids: list[list[int]] = []
        mask_lps: list[float] = []
        finish = None
        try:
            while finish is None:
                while not resume.is_set() and not state["abort"]:
                    await asyncio.sleep(0.005)
                if state["abort"]:
                    finish = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
                    break
                if job["max_new"] == 0:
                    finish = {"type": "length", "length": 0}
                    break
                while self.cut_after is not None and len(ids) >= self.cut_after and not self._healed.is_set():
                    await asyncio.sleep(0.01)  # the link is down: nothing reaches the client
                await asyncio.sleep(self.token_delay_s)
                if state["abort"]:
                    continue
                token_id, logprob = self.token(job["prompt"], len(ids), self.weight_version, self.vocab_size)
                ids.append(token_id)
                entries.append([logprob, token_id, None])
                mask_ids.append([token_id])
                mask_lps.append(_truncated(logprob) if job["truncating"] else logprob)
                if token_id in job["stops"]:
                    finish = {"type": "stop", "matched": token_id}
                elif len(ids) >= job["max_new"]:  # the last token comes in the finishing chunk
                    finish = {"type": "length", "length": job["max_new"]}
                elif job["stream"]:
                    yield self._chunk(job, ids, entries, mask_ids, mask_lps, None)
            yield self._chunk(job, ids, entries, mask_ids, mask_lps, finish)
        finally:
            del self._running[rid]
            async with idle:
                idle.notify_all()

    def _chunk(self, job, ids, entries, mask_ids, mask_lps, finish) -> dict:
        meta = {"id": job["rid"], "finish_reason": finish, "prompt_tokens": len(job["prompt"]),
                "weight_version": self.weight_version, "num_retractions": 0, "reasoning_tokens": 0,
                "completion_tokens": len(ids), "cached_tokens": 0}
        if job["logprob"]:
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = list(entries)
            meta["output_token_logprobs_length"] = len(entries)
        if job["mask"]:
            meta["output_token_sampling_mask"] = list(mask_ids)
            meta["output_token_sampling_logprobs"] = list(mask_lps)
            meta["output_token_sampling_mask_length"] = len(mask_ids)
        return {"text": "".join(f"<{t}>" for t in ids), "output_ids": list(ids), "meta_info": meta}

    # -- control --------------------------------------------------------------------------

    async def _abort(self, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        self.calls.append(("/abort_request", body))
        while self.cut_after is not None and not self._healed.is_set():  # never reaches the server
            await asyncio.sleep(0.01)
        targets = list(self._running) if body.get("abort_all") else [body.get("rid") or ""]
        for rid in targets:
            if rid in self._running:
                self._running[rid]["abort"] = True
                self.aborted.add(rid)
        return Response(status_code=200)

    async def _pause(self, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        self.calls.append(("/pause_generation", body))
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return _validation_error(f"mode: Input should be 'abort', 'retract' or 'in_place', got {mode!r}")
        resume, _ = self._events()
        resume.clear()
        self.paused = True
        if mode == "abort":
            for rid, state in self._running.items():
                state["abort"] = True
                self.aborted.add(rid)
            resume.set()  # let the aborted requests return their final chunk
            await asyncio.sleep(0)
            while self._running:
                await asyncio.sleep(0.01)
            resume.clear()
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    async def _continue(self, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        self.calls.append(("/continue_generation", body))
        resume, _ = self._events()
        self.paused = False
        resume.set()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    async def _update_weights(self, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        self.calls.append(("/update_weights_from_disk", body))
        if not isinstance(body.get("model_path"), str):
            return _validation_error("model_path: Field required")
        _, idle = self._events()
        if not self.paused:  # SGLang takes the model-update writer lock: in-flight requests finish first
            async with idle:
                await idle.wait_for(lambda: not self._running)
        path = Path(body["model_path"])
        if not path.exists():
            message = f"Failed to get weights iterator: {path} is not a directory or file. Rolled back to the old weights."
            return JSONResponse({"success": False, "message": message, "num_paused_requests": 0}, status_code=400)
        version = body.get("weight_version")
        if (self.refuse_versions_from is not None and version is not None and int(version) >= self.refuse_versions_from
                and (self.refuse_versions_to is None or int(version) < self.refuse_versions_to)):
            message = (f"Failed to update weights: size mismatch for model.embed_tokens.weight (version {version}). "
                       "Rolled back to the old weights.")
            return JSONResponse({"success": False, "message": message, "num_paused_requests": 0}, status_code=400)
        self.model_path = str(path)
        message = "Succeeded to update model weights."
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
            message += f" Weight version updated to {self.weight_version}."
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    async def _flush_cache(self, request: Request) -> Response:
        self.calls.append(("/flush_cache", {}))
        if self._running:
            return Response("Flush cache failed.\n", status_code=400)
        return Response("Cache flushed.\nPlease check backend logs for more details. (When there are running or "
                        "waiting requests, the operation will not be performed.)\n", status_code=200)

    async def _health(self, request: Request) -> Response:
        return Response(status_code=503 if self.unhealthy else 200)

    async def _model_info(self, request: Request) -> Response:
        return JSONResponse({"model_path": self.model_path, "served_model_name": self.model_path,
                             "tokenizer_path": self.model_path, "is_generation": True,
                             "preferred_sampling_params": None, "weight_version": self.weight_version,
                             "load_format": "auto", "model_type": "fake", "architectures": ["FakeForCausalLM"]})

    async def _models(self, request: Request) -> Response:
        card = {"id": self.model_path, "object": "model", "created": 0, "owned_by": "sglang",
                "root": self.model_path, "parent": None, "max_model_len": self.context_len}
        return JSONResponse({"object": "list", "data": [card]})


def _truncated(logprob: float) -> float:
    """The fake's behaviour log-prob under a truncated (top_p / top_k) distribution: higher."""
    return min(0.0, logprob + 0.25)


async def _json_body(request: Request) -> dict | Response:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        return _validation_error(f"JSON decode error: {exc}")
    if not isinstance(body, dict):
        return _validation_error("Input should be a valid dictionary or object to extract fields from")
    return body


def _validation_error(message: str) -> Response:
    """FastAPI's RequestValidationError as SGLang rewrites it: a 400 ErrorResponse."""
    return JSONResponse({"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400},
                        status_code=400)


def _contract_error(body: dict) -> str | None:
    """The schema gate's serde-style text for the fields the adapter sends, or None."""
    ids = body.get("input_ids")
    if ids is not None:
        if not isinstance(ids, list):
            return f"invalid type: {_unexpected(ids)}, expected a sequence"
        bad = [v for v in ids if not isinstance(v, int) or isinstance(v, bool)]
        if bad:
            return f"invalid type: {_unexpected(bad[0])}, expected i64"
    sp = body.get("sampling_params")
    if sp is None:
        return None
    if not isinstance(sp, dict):
        return f"invalid type: {_unexpected(sp)}, expected struct SamplingParams"
    for key, value in sp.items():
        if key not in SAMPLING_FIELDS:
            listed = ", ".join(f"`{f}`" for f in SAMPLING_FIELDS)
            return f"unknown field `{key}`, expected one of {listed}"
        if key in ("max_new_tokens", "top_k") and (not isinstance(value, int) or isinstance(value, bool)):
            return f"invalid type: {_unexpected(value)}, expected i64"
        if key in ("temperature", "top_p") and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return f"invalid type: {_unexpected(value)}, expected f64"
    return None


def _unexpected(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    return "sequence" if isinstance(v, list) else "map"
