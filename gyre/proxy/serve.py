"""`gyre proxy serve`: the proxy on its own, in front of the engines a config names.

For pointing a harness (Claude Code, mini-swe-agent) at a policy by hand, or for serving
rollouts to a run elsewhere. Runs in the foreground until interrupted.

With `record_path` set, every call is recorded token-in/token-out in that DuckDB file as it
is made: the tables a run keeps its calls in (`calls`, `call_tokens`, `call_segments`,
`call_fallbacks`), appended in batches at least every second by a `CallLog`. So a kill -9
loses at most the last second of calls, and SIGTERM or SIGINT lose none: uvicorn stops
taking requests, lets those in flight finish (and be recorded), then the log writes the rest.
uvicorn re-raises the signal once it has stopped; SIGTERM's default action would end the
process right there, so both signals are turned into `SystemExit(128 + signal)` and the
`finally` below always runs.
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import uvicorn

from gyre.engines.models.hf import load_tokenizer, stop_token_ids
from gyre.engines.models.packaged import resolve_model_path
from gyre.engines.models.tiny import TinyModelSpec, cached_tiny_model
from gyre.proxy.app import create_app
from gyre.proxy.completion import ProxyDefaults
from gyre.proxy.config import ProxyServeConfig, load_proxy_config
from gyre.proxy.gc_tuning import serving_gc
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import SessionRegistry
from gyre.proxy.toolcalls import parser_for
from gyre.storage.call_log import CallLog
from gyre.storage.store import CALL_TABLES, RunStore

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def model_dir(config: ProxyServeConfig) -> Path:
    if config.model.path is not None:  # a directory, or `pkg:<package>` converted once under the cache
        return resolve_model_path(config.model.path, config.cache_dir / "models")
    tiny = config.model.tiny
    spec = TinyModelSpec(vocab_size=tiny.vocab_size, hidden_size=tiny.hidden_size,
                         num_hidden_layers=tiny.num_hidden_layers, seed=tiny.seed)
    return cached_tiny_model(config.cache_dir / "models", spec)


def build(config: ProxyServeConfig, sessions: SessionRegistry | None = None):
    """(app, router, sessions, engines) for `config`, engines started."""
    path = model_dir(config)
    tokenizer = load_tokenizer(path)
    engines = []
    try:
        for spec in config.engines:
            engines.append(_engine(spec, path))
    except BaseException:
        for engine in engines:
            engine.close()
        raise
    router = EngineRouter(engines, max_wait_s=config.no_engine_wait_s)
    sessions = sessions or SessionRegistry()
    for key, execution_id in config.keys.items():
        sessions.add(execution_id, key)
    app = create_app(
        router, sessions, tokenizer,
        model_name=config.model_name or path.name,
        stop_token_ids=stop_token_ids(tokenizer),
        defaults=ProxyDefaults(temperature=config.temperature, max_new_tokens=config.max_new_tokens,
                               max_new_tokens_cap=config.max_new_tokens_cap,
                               force_temperature=config.force_temperature),
        parser=parser_for(config.tool_parser),
        max_body_bytes=config.max_body_bytes,
        max_concurrent_requests=config.max_concurrent_requests,
        max_context_tokens=min(e.max_context for e in engines),
        build_processes=config.build_processes,
    )
    return app, router, sessions, engines


def _engine(spec, path: Path):
    """One engine of the config: a torch reference engine here, or an SGLang server, once healthy."""
    if spec.type == "sglang":
        from gyre.engines.sglang.adapter import SGLangRolloutEngine

        engine = SGLangRolloutEngine(spec.url, spec.id, base_model_dir=path)
        try:
            engine.wait_healthy(spec.healthy_timeout_s)
        except BaseException:
            engine.close()
            raise
        return engine
    from gyre.engines.torch.rollout import TorchRolloutEngine

    return TorchRolloutEngine(path, engine_id=spec.id, max_batch_size=spec.max_batch_size, seed=spec.seed,
                              device=spec.device, prefix_cache_bytes=spec.prefix_cache_bytes)


def _exit_on_signal(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def check_port(host: str, port: int, config_path: Path | str) -> None:
    """A ValueError naming the address when it cannot be bound (in use, not this host's): said before any
    model loads, not as uvicorn's errno after."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ValueError(f"{host}:{port} cannot be served ({exc.strerror}): another process listens there, "
                             f"or the address is not this machine's; change host/port in {config_path}") from None


def serve(config_path: Path | str) -> None:
    config = load_proxy_config(config_path)
    check_port(config.host, config.port, config_path)
    previous = {sig: signal.signal(sig, _exit_on_signal) for sig in STOP_SIGNALS}
    store = call_log = app = None
    engines = []
    try:
        if config.record_path is not None:
            store = RunStore(config.record_path, tables=CALL_TABLES)
            call_log = CallLog(store)
        app, _, _, engines = build(config, SessionRegistry(sink=call_log.put if call_log else None))
        server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="info",
                                               access_log=False, lifespan="off"))
        with serving_gc(config.gc_threshold):
            server.run()  # returns once stopped; a stop signal is re-raised here (SystemExit)
    finally:
        try:
            if call_log is not None:
                call_log.close()
        finally:
            if store is not None:
                store.close()
            for engine in engines:
                engine.close()
            if app is not None and app.state.core.builds is not None:
                app.state.core.builds.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
