"""The torch reference engine behind SGLang's HTTP API: a rollout engine in another process.

A rollout cell that lives in its own process (a Ray actor, on this host or another) serves
its engine over HTTP, and the driver's proxy router reaches it through the same adapter it
uses for a real SGLang server (`gyre.engines.sglang.adapter`). So there is one wire format
for every remote rollout engine, SGLang's, and a CPU box runs the same path a GPU cluster
does: SGLang there, this server here.

The endpoints and fields are the subset the adapter relies on (its docstring lists them):
`/generate` from `input_ids` (streamed as cumulative SSE chunks, or one answer), with
`output_token_logprobs` triples, `finish_reason` objects and `weight_version`;
`/abort_request`, `/pause_generation` (`in_place`: hold; `abort`: end what runs, then
hold), `/continue_generation`, `/update_weights_from_disk` (an HF directory holding
`model.safetensors`, or a safetensors file), `/flush_cache`, `/health`, `/health_generate`,
`/model_info` and `/v1/models` (`max_model_len`). Differences from SGLang, on purpose:
the torch engine reports the behaviour log-prob of the (possibly truncated) distribution it
sampled from, so with `top_p`/`top_k` `output_token_logprobs` holds the same values as
`output_token_sampling_logprobs` (SGLang's hold the untruncated ones; gyre reads only the
sampling ones then); and a pause takes effect between batches, never mid-token.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gyre.engines.base import ContextLengthError, EngineDrainingError, GenerationRequest, SamplingParams
from gyre.engines.torch.rollout import TorchRolloutEngine

TOP_K_ALL = -1  # SGLang's "no top-k"
WEIGHTS_FILE = "model.safetensors"


class TorchEngineServer:
    """The app around one engine; `app` is what uvicorn serves."""

    def __init__(self, engine: TorchRolloutEngine, model_dir: Path, max_concurrent: int = 256) -> None:
        self.engine = engine
        self.model_dir = Path(model_dir)
        self._pool = ThreadPoolExecutor(max_concurrent, thread_name_prefix=f"{engine.engine_id}-serve")
        self._stops: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.app = Starlette(routes=[
            Route("/generate", self._generate, methods=["POST"]),
            Route("/abort_request", self._abort, methods=["POST"]),
            Route("/pause_generation", self._pause, methods=["POST"]),
            Route("/continue_generation", self._continue, methods=["POST"]),
            Route("/update_weights_from_disk", self._update_weights, methods=["POST"]),
            Route("/flush_cache", self._flush_cache, methods=["GET", "POST"]),
            Route("/health", self._health, methods=["GET"]),
            Route("/health_generate", self._health, methods=["GET"]),
            Route("/model_info", self._model_info, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])  # fmt: skip

    def close(self) -> None:
        with self._lock:
            for stop in self._stops.values():
                stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- generation -----------------------------------------------------------------------

    async def _generate(self, request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        try:
            job = _job(body)
        except (TypeError, ValueError) as exc:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
        stop = threading.Event()
        with self._lock:
            self._stops[job.rid] = stop
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
        on_token = (lambda t, lp: loop.call_soon_threadsafe(tokens.put_nowait, (t, lp))) if job.stream else None
        generation = GenerationRequest(job.prompt, job.params, stop=stop, on_token=on_token)
        future = loop.run_in_executor(self._pool, self.engine.generate, generation)
        future.add_done_callback(lambda _: tokens.put_nowait(None))

        async def finish() -> dict | Response:
            try:
                result = await future
            except ContextLengthError as exc:
                return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
            except EngineDrainingError as exc:
                return JSONResponse({"error": {"message": str(exc)}}, status_code=503)
            finally:
                with self._lock:
                    self._stops.pop(job.rid, None)
            return _chunk(job, result.output_ids, result.logprobs, _finish(result.finish_reason, result.output_ids,
                                                                           job), result.policy_version)

        if not job.stream:
            answer = await finish()
            return answer if isinstance(answer, Response) else JSONResponse(answer)

        async def sse():
            ids: list[int] = []
            lps: list[float] = []
            try:
                while (item := await tokens.get()) is not None:
                    ids.append(item[0])
                    lps.append(item[1])
                    yield _sse(_chunk(job, ids, lps, None, self.engine.policy_version))
            finally:  # the client went away mid-stream: stop sampling for nobody
                if not future.done():
                    stop.set()
            answer = await finish()
            if isinstance(answer, Response):  # refused once the stream had begun: an error line, as SGLang does
                message = json.loads(answer.body)["error"]["message"]
                yield _sse({"error": {"message": message, "type": "invalid_request_error",
                                      "code": answer.status_code, "retryable": answer.status_code == 503}})
            else:
                yield _sse(answer)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    # -- control --------------------------------------------------------------------------

    async def _abort(self, request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        with self._lock:
            targets = list(self._stops.values()) if body.get("abort_all") else [self._stops.get(body.get("rid") or "")]
        for stop in targets:
            if stop is not None:
                stop.set()
        return Response(status_code=200)

    async def _pause(self, request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return JSONResponse({"object": "error", "message": f"mode: Input should be 'abort', 'retract' or "
                                 f"'in_place', got {mode!r}", "type": "Bad Request", "param": None, "code": 400},
                                status_code=400)
        if mode != "in_place":  # abort / retract: what runs ends now (retract would requeue on SGLang)
            with self._lock:
                for stop in self._stops.values():
                    stop.set()
        await asyncio.get_running_loop().run_in_executor(None, self.engine.pause)
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    async def _continue(self, request: Request) -> Response:
        self.engine.resume()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    async def _update_weights(self, request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        path = body.get("model_path")
        if not isinstance(path, str):
            return JSONResponse({"object": "error", "message": "model_path: Field required", "type": "Bad Request",
                                 "param": None, "code": 400}, status_code=400)
        weights = Path(path) / WEIGHTS_FILE if Path(path).is_dir() else Path(path)
        version = body.get("weight_version")
        if not weights.is_file():
            return _update_failed(f"{weights} is not a safetensors file (an HF directory needs {WEIGHTS_FILE})")
        try:
            number = int(version) if version is not None else self.engine.policy_version
        except ValueError:
            return _update_failed(f"weight_version {version!r}: gyre's versions are integers")
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.engine.load_weights, weights, number)
        except (RuntimeError, ValueError, OSError) as exc:  # shapes or names that do not fit: the old weights stay
            return _update_failed(f"{weights}: {exc}")
        return JSONResponse({"success": True, "num_paused_requests": 0,
                             "message": f"Succeeded to update model weights. Weight version updated to {number}."})

    async def _flush_cache(self, request: Request) -> Response:
        with self._lock:
            busy = bool(self._stops)
        if busy:
            return Response("Flush cache failed.\n", status_code=400)
        if self.engine.prefix_cache is not None:
            self.engine.prefix_cache.clear()
        return Response("Cache flushed.\n", status_code=200)

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _model_info(self, request: Request) -> Response:
        path = str(self.model_dir)
        return JSONResponse({"model_path": path, "tokenizer_path": path, "is_generation": True,
                             "weight_version": str(self.engine.policy_version), "model_type": "torch-reference"})

    async def _models(self, request: Request) -> Response:
        card = {"id": str(self.model_dir), "object": "model", "owned_by": "gyre",
                "max_model_len": self.engine.max_context}
        return JSONResponse({"object": "list", "data": [card]})


class _Job:
    def __init__(self, rid: str, prompt: list[int], params: SamplingParams, stream: bool, logprob: bool,
                 mask: bool) -> None:
        self.rid, self.prompt, self.params, self.stream, self.logprob, self.mask = rid, prompt, params, stream, logprob, mask


def _job(body: dict) -> _Job:
    ids = body.get("input_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise ValueError("input_ids: a list of token ids is required (this server does no tokenisation)")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise ValueError("sampling_params must be an object")
    top_k = int(sp.get("top_k", TOP_K_ALL))
    if top_k < 1 and top_k != TOP_K_ALL:
        raise ValueError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    top_p = float(sp.get("top_p", 1.0))
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
    params = SamplingParams(temperature=float(sp.get("temperature", 1.0)),
                            max_new_tokens=int(sp.get("max_new_tokens", 128)),
                            stop_token_ids=tuple(int(t) for t in sp.get("stop_token_ids") or ()),
                            top_p=top_p, top_k=0 if top_k == TOP_K_ALL else top_k)
    return _Job(str(body.get("rid") or uuid.uuid4().hex), list(ids), params, bool(body.get("stream")),
                bool(body.get("return_logprob")), bool(body.get("return_sampling_mask")))


def _finish(reason: str, ids: list[int], job: _Job) -> dict:
    if reason == "stop":
        return {"type": "stop", "matched": ids[-1] if ids else None}
    if reason == "length":
        return {"type": "length", "length": len(ids)}
    return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def _chunk(job: _Job, ids: list[int], lps: list[float], finish: dict | None, version: int) -> dict:
    meta: dict = {"id": job.rid, "finish_reason": finish, "prompt_tokens": len(job.prompt),
                  "completion_tokens": len(ids), "cached_tokens": 0, "weight_version": str(version)}
    if job.logprob:
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = [[lp, t, None] for t, lp in zip(ids, lps)]
    if job.mask:
        meta["output_token_sampling_logprobs"] = list(lps)
    return {"text": "", "output_ids": list(ids), "meta_info": meta}


def _sse(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _update_failed(message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": f"Failed to update weights: {message}. Rolled back to the "
                         "old weights.", "num_paused_requests": 0}, status_code=400)


async def _json_object(request: Request) -> dict | Response:
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return JSONResponse({"object": "error", "message": "the body must be a JSON object", "type": "Bad Request",
                             "param": None, "code": 400}, status_code=400)
    return body
