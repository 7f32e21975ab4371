"""The model-call proxy's HTTP app: OpenAI and Anthropic endpoints in front of the router.

Every harness reaches the policy only through here. A request is authenticated by its
per-execution key (OpenAI `Authorization: Bearer`, Anthropic `x-api-key`; either header
works on either API, and a request carrying both is served if either key is known), its
body is size-checked (`max_body_bytes`, before and while it is read) and must keep arriving
(each part within `body_idle_timeout_s` of the last, else a 408), it is validated at this
boundary, and the call runs in `completion.py`, which checks the prompt's length against
the context (`limits.py`) before templating it (`offload.py` says on which thread). Errors
come back in the shape of the API the path belongs to: `/v1/messages*` answers like
Anthropic, everything else like OpenAI.

Endpoints: `POST /v1/chat/completions`, `POST /v1/messages` (query strings such as
`?beta=true` are ignored), `POST /v1/messages/count_tokens`, `GET /v1/models[/{id}]`,
`GET|HEAD /` (Claude Code probes it) and `GET /health`.

Plain Starlette rather than FastAPI: validation is explicit (`orjson` on the raw bytes, then
pydantic, each execution's earlier messages reused from `message_cache.py`) and the
per-request overhead is what the proxy benchmark measures. For the same
reason the two model-call endpoints are dispatched straight from the ASGI entry point
(`ProxyApp`): no middleware layers or route matching, headers read once from the scope,
the body read straight from `receive`. Every other path goes through Starlette's router.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gyre.proxy import anthropic_api, openai_api
from gyre.proxy.build_processes import BuildProcesses
from gyre.proxy.completion import CompletionCore, ProxyDefaults
from gyre.proxy.errors import ProxyError, error_response, validation_problem
from gyre.proxy.limits import PromptLimit
from gyre.proxy.message_cache import MessageError
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import ExecutionSession, SessionRegistry
from gyre.proxy.toolcalls import QwenToolCallParser, ToolCallParser

__all__ = ["ProxyDefaults", "create_app"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 32 * 2**20
"""Largest request body accepted (a 1M-token conversation is ~4 MB of text)."""
DEFAULT_MAX_CONCURRENT_REQUESTS = 512
"""Engine calls in flight at once on engines that block a thread (`RolloutEngine.generate`); an engine
that takes requests without blocking (`engines.base.Submits`: the torch engine) holds none of these threads."""
DEFAULT_BODY_IDLE_TIMEOUT_S = 60.0
"""Longest wait for the next part of a request body: a client that stops sending mid-body
(a slowloris, a stalled upload) gets a 408 instead of holding a coroutine for ever."""


def _json(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def _validation_message(exc: ValidationError) -> str:
    return f"invalid request: {validation_problem(exc) or 'body: bad input'}"


def _headers(request: Request) -> dict[str, str]:
    """The request's headers as a plain dict (names are lower-case in ASGI)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in request.scope["headers"]}


class ProxyApp(Starlette):
    """Starlette, except that POSTs to `hot` paths go straight to their handler."""

    hot: dict[str, Callable[[Request], Awaitable[Response]]]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.hot.get(scope["path"])
            if handler is not None:
                response = await handler(Request(scope, receive))
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class Endpoints:
    """The proxy's request handlers around one `CompletionCore`: authentication, reading and
    validating a body, and one method per endpoint."""

    def __init__(self, core: CompletionCore, sessions: SessionRegistry, router: EngineRouter, model_name: str,
                 max_body_bytes: int, body_idle_timeout_s: float) -> None:
        self.core, self.sessions, self.router = core, sessions, router
        self.model_name = model_name
        self.max_body_bytes = max_body_bytes
        self.body_idle_timeout_s = body_idle_timeout_s
        self.inline_reasoning = "reasoning_content" not in (core.tokenizer.chat_template or "")
        self.template = partial(openai_api.template_message, inline_reasoning=self.inline_reasoning)
        created = int(time.time())
        self.model_entry = {
            "id": model_name, "object": "model", "type": "model", "display_name": model_name, "created": created,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)), "owned_by": "gyre",
        }

    def authenticate(self, headers: dict[str, str]) -> ExecutionSession:
        """Either header's key: a client configured with both an API key and an auth token
        (a real `ANTHROPIC_API_KEY` left in the environment next to `ANTHROPIC_AUTH_TOKEN`
        holding this proxy's key) may send both `x-api-key` and `Authorization`."""
        key = headers.get("x-api-key")
        session = self.sessions.session(key) if key else None
        if session is None:
            auth = headers.get("authorization", "")
            bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            session = self.sessions.session(bearer) if bearer else None
        if session is None:
            raise ProxyError(401, "unknown or missing API key", "authentication")
        return session

    async def read_body(self, request: Request, headers: dict[str, str]) -> bytearray:
        limit, idle_s = self.max_body_bytes, self.body_idle_timeout_s
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise ProxyError(413, f"request body exceeds {limit} bytes", "too_large")
        body = bytearray()  # appended in place: a many-chunk body is copied once, not once per chunk
        while True:
            try:
                async with asyncio.timeout(idle_s):  # no task per chunk, unlike wait_for
                    message = await request.receive()
            except TimeoutError:
                raise ProxyError(408, f"request body incomplete: nothing received for {idle_s:g} s "
                                 f"after {len(body)} bytes", "timeout") from None
            if message["type"] != "http.request":
                raise ProxyError(400, "client disconnected before sending the whole body")
            body += message.get("body", b"")
            if len(body) > limit:
                raise ProxyError(413, f"request body exceeds {limit} bytes", "too_large")
            if not message.get("more_body", False):
                return body

    async def read_conversation(self, request: Request, kind: str, model: type[BaseModel], adapter: TypeAdapter,
                                derive: Callable[[Any], Any] | None = None):
        """The request's headers, its execution's session, and its body validated: `messages`
        only where new to the execution (`message_cache.py`), with the derived form of each
        message when `derive` is given."""
        headers = _headers(request)
        session = self.authenticate(headers)
        body = await self.read_body(request, headers)
        try:
            raw = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ProxyError(400, f"invalid request: body: invalid JSON: {exc}") from exc
        derived: list[Any] = []
        if isinstance(raw, dict) and isinstance(raw.get("messages"), list):
            try:
                messages, derived = session.messages.messages(kind, raw["messages"], adapter, derive)
            except MessageError as exc:
                raise ProxyError(400, f"invalid request: {exc}") from exc
            raw = {**raw, "messages": messages}
        try:
            return headers, session, model.model_validate(raw), derived
        except ValidationError as exc:
            raise ProxyError(400, _validation_message(exc)) from exc

    async def chat_completions(self, request: Request) -> Response:
        headers, session, body, templated = await self.read_conversation(
            request, "openai", openai_api.ChatCompletionRequest, openai_api.MESSAGE, self.template)
        return await openai_api.chat_completions(self.core, body, session, headers, self.model_name,
                                                 self.inline_reasoning, request.receive, templated)

    async def messages(self, request: Request) -> Response:
        headers, session, body, _ = await self.read_conversation(
            request, "anthropic", anthropic_api.MessagesRequest, anthropic_api.MESSAGE)
        return await anthropic_api.messages(self.core, body, session, headers, self.model_name,
                                            self.inline_reasoning, request.receive)

    async def count_tokens(self, request: Request) -> Response:
        headers, session, body, _ = await self.read_conversation(
            request, "anthropic", anthropic_api.CountTokensRequest, anthropic_api.MESSAGE)
        return await anthropic_api.count_tokens(self.core, body, session, headers, self.inline_reasoning)

    async def models(self, _: Request) -> Response:
        return _json({"object": "list", "data": [self.model_entry], "has_more": False,
                      "first_id": self.model_name, "last_id": self.model_name})

    async def model(self, request: Request) -> Response:
        if request.path_params["model_id"] != self.model_name:
            raise ProxyError(404, f"model {request.path_params['model_id']!r} not found", "not_found")
        return _json(self.model_entry)

    async def root(self, _: Request) -> Response:
        return _json({"status": "ok", "service": "gyre proxy"})

    async def health(self, _: Request) -> Response:
        return _json({"status": "ok", "engines": self.router.load()})


def endpoint(api: str, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """`handler` answering every error in `api`'s shape: a `ProxyError` as itself (a 408 also
    closes the connection: the rest of the body may never come), anything else as a logged 500."""
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except ProxyError as exc:
            response = error_response(exc, api)
            if exc.status == 408:
                response.headers["connection"] = "close"
            return response
        except Exception:  # a bug of ours: log it, answer in the API's shape, keep serving
            log.exception("proxy: unhandled error on %s", request.url.path)
            return error_response(ProxyError(500, "internal proxy error", "internal"), api)

    return run


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own errors (no such path, a method not allowed) in the shape of the path's API."""
    kind = "not_found" if exc.status_code == 404 else "invalid_request"
    api = "anthropic" if request.url.path.startswith("/v1/messages") else "openai"
    return error_response(ProxyError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind), api)


def create_app(
    router: EngineRouter,
    sessions: SessionRegistry,
    tokenizer,
    *,
    model_name: str,
    stop_token_ids: tuple[int, ...],
    defaults: ProxyDefaults = ProxyDefaults(),
    parser: ToolCallParser | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS,
    max_context_tokens: int | None = None,
    body_idle_timeout_s: float = DEFAULT_BODY_IDLE_TIMEOUT_S,
    build_processes: int = 0,
) -> Starlette:
    """`max_context_tokens`: the engines' context, for refusing a prompt that cannot fit it
    before any templating (`limits.py`); None leaves that to the engine. `build_processes`: worker processes
    that build prompts (`build_processes.py`; 0 builds them in this process). Whoever stops the app's server
    stops them: `app.state.core.builds.close()`."""
    executor = ThreadPoolExecutor(max_workers=max_concurrent_requests, thread_name_prefix="gyre-proxy-engine")
    limit = PromptLimit.for_tokenizer(tokenizer, max_context_tokens) if max_context_tokens is not None else None
    builds = BuildProcesses(tokenizer, build_processes) if build_processes else None
    if builds is not None:
        sessions.on_close = builds.forget
    core = CompletionCore(
        router, sessions, tokenizer, executor,
        stop_token_ids=stop_token_ids, defaults=defaults, parser=parser or QwenToolCallParser(), limit=limit,
        builds=builds,
    )
    ends = Endpoints(core, sessions, router, model_name, max_body_bytes, body_idle_timeout_s)
    chat, messages = endpoint("openai", ends.chat_completions), endpoint("anthropic", ends.messages)
    routes = [
        Route("/", endpoint("openai", ends.root), methods=["GET", "HEAD"]),
        Route("/health", endpoint("openai", ends.health), methods=["GET", "HEAD"]),
        Route("/v1/models", endpoint("openai", ends.models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", endpoint("openai", ends.model), methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/chat/completions", chat, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", endpoint("anthropic", ends.count_tokens), methods=["POST"]),
    ]
    app = ProxyApp(routes=routes, exception_handlers={HTTPException: http_error})
    app.hot = {"/v1/chat/completions": chat, "/chat/completions": chat, "/v1/messages": messages}
    app.state.core = core
    return app
