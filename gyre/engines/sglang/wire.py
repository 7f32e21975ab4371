"""SGLang's `/generate` wire format: the request gyre sends and how an answer or stream reads.

Split from the adapter (`gyre.engines.sglang.adapter`), which keeps the engine's state (pause,
drain, the stop watcher) and the other endpoints: everything here is a function of one request,
one answer or one open stream, with no state of its own. Written from SGLang 0.5.23's source, as
the adapter is.

Fields relied on:
- `POST /generate` `{rid, input_ids, sampling_params: {max_new_tokens, temperature, top_p,
  top_k (-1 = all; SGLang refuses 0), stop_token_ids}, return_logprob: true,
  logprob_start_len: -1 (output log-probs only), stream}`; the answer's `output_ids` and
  `meta_info.output_token_logprobs` (`[logprob, token_id, text]` triples),
  `meta_info.finish_reason` (`{"type": "stop" | "length" | "abort", ...}`) and
  `meta_info.weight_version`. Streaming is SSE `data: {...}` lines of cumulative chunks
  (the server's default, non-incremental mode: do not launch it with
  `--incremental-streaming-output`), ending with `data: [DONE]`; an error mid-stream is a
  `data: {"error": {...}}` line.
- With `top_p < 1` or `top_k > 0`, SGLang's `output_token_logprobs` are those of the
  temperature-scaled but untruncated distribution, while gyre's behaviour log-probs are of
  the truncated one it sampled from; the request then also asks `return_sampling_mask:
  true` and takes `meta_info.output_token_sampling_logprobs` (the selected token's
  behaviour log-prob under the sampling support).
- Errors come as `{"error": str}`, `{"error": {"message"}}` or `{"message"}`; a prompt past the
  context is refused with a message naming the "context length".
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx

from gyre.engines.base import ContextLengthError, GenerationRequest

TOP_K_ALL = -1  # SGLang's "whole vocabulary"; gyre's top_k == 0


class SGLangError(RuntimeError):
    """An SGLang endpoint answered with an error (or not at all); names the endpoint."""

    def __init__(self, base_url: str, endpoint: str, status: int | None, message: str) -> None:
        self.endpoint, self.status = endpoint, status
        got = f"HTTP {status}" if status is not None else "no answer"
        super().__init__(f"SGLang {base_url}{endpoint} failed ({got}): {message}")


def generate_payload(rid: str, request: GenerationRequest, room: int) -> tuple[dict, bool]:
    """The `/generate` body of `request` (at most `room` new tokens), and whether its sampling
    truncates (top_p/top_k: behaviour log-probs then come from the sampling support)."""
    params = request.params
    truncating = params.temperature > 0 and (params.top_p < 1.0 or params.top_k > 0)
    payload = {
        "rid": rid,
        "input_ids": list(request.prompt_ids),
        "sampling_params": {
            "max_new_tokens": min(params.max_new_tokens, room),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else TOP_K_ALL,
            "stop_token_ids": list(params.stop_token_ids),
        },
        "return_logprob": True,
        "logprob_start_len": -1,
    }
    if truncating:
        payload["return_sampling_mask"] = True
    return payload, truncating


def output_tokens(chunk: dict, truncating: bool, base_url: str) -> tuple[list[int], list[float]]:
    """Output ids and behaviour log-probs of a (cumulative) /generate answer."""
    meta = chunk["meta_info"]
    ids = [int(t) for t in chunk["output_ids"]]
    if truncating:
        if "output_token_sampling_logprobs" not in meta:
            raise SGLangError(base_url, "/generate", 200, "top_p/top_k sampling needs meta_info."
                              "output_token_sampling_logprobs (return_sampling_mask); this server has none")
        logprobs = [float(v) for v in meta["output_token_sampling_logprobs"]]
    else:
        entries = meta["output_token_logprobs"]
        if [int(e[1]) for e in entries] != ids:
            raise SGLangError(base_url, "/generate", 200, "output_token_logprobs do not match output_ids")
        logprobs = [float(e[0]) for e in entries]
    return ids, logprobs[: len(ids)]


def finish_kind(chunk: dict, base_url: str) -> str:
    """`stop`, `length` or `abort` from a finished answer; a request the server failed raises."""
    reason = chunk["meta_info"].get("finish_reason") or {}
    kind = reason.get("type")
    if kind == "abort" and reason.get("status_code") is not None:  # the server failed the request
        raise SGLangError(base_url, "/generate", reason["status_code"], reason.get("message") or "aborted")
    if kind not in ("stop", "length", "abort"):
        raise SGLangError(base_url, "/generate", 200, f"unknown finish_reason {reason!r}")
    return kind


def error_message(body) -> str:
    """The text of SGLang's error shapes: {"error": str}, {"error": {"message"}}, {"message"}."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error is not None:
            return str(error)
        if "message" in body:
            return str(body["message"])
    return json.dumps(body)


def endpoint_error(base_url: str, endpoint: str, status: int, message: str) -> Exception:
    """The exception for an error answer: a context-length refusal of `/generate` is a
    `ContextLengthError` (as the torch engine raises), anything else an `SGLangError`."""
    if endpoint == "/generate" and "context length" in message:
        return ContextLengthError(f"SGLang {base_url}{endpoint}: {message}")
    return SGLangError(base_url, endpoint, status, message)


def stream_chunks(response: httpx.Response, stopped, base_url: str) -> Iterator[dict]:
    """The cumulative chunks of a streamed `/generate`, up to `data: [DONE]`; an error line
    raises. A stream cut after its stop (`cut_stream`) simply ends."""
    for line in stream_lines(response, stopped):
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:  # a request refused once the stream had begun
            raise endpoint_error(base_url, "/generate", response.status_code, error_message(chunk))
        yield chunk


def stream_lines(response: httpx.Response, stopped) -> Iterator[str]:
    """The stream's lines; a stream cut after its stop (`cut_stream`) simply ends."""
    try:
        yield from response.iter_lines()
    except (httpx.ReadError, httpx.RemoteProtocolError):
        if not stopped():
            raise


def cut_stream(response: httpx.Response) -> None:
    """Shut the stream's socket: its blocked reader wakes with an error (closing alone would not)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed: the reader is not blocked on it
