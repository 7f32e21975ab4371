"""`gyre proxy serve`: the proxy on its own, in front of the engines a config names.

For pointing a harness (Claude Code, mini-swe-agent) at a policy by hand, or for serving
rollouts to a run elsewhere. Runs in the foreground until interrupted; then, if the
config says so, writes every recorded call as JSON lines.
"""

from __future__ import annotations

from pathlib import Path

import uvicorn

from gyre.engines.hf import load_tokenizer, stop_token_ids
from gyre.engines.packaged import resolve_model_path
from gyre.engines.tiny_model import TinyModelSpec, cached_tiny_model
from gyre.proxy.app import create_app
from gyre.proxy.completion import ProxyDefaults
from gyre.proxy.config import ProxyServeConfig, load_proxy_config
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import SessionRegistry
from gyre.proxy.toolcalls import parser_for


def model_dir(config: ProxyServeConfig) -> Path:
    if config.model.path is not None:  # a directory, or `pkg:<package>` converted once under the cache
        return resolve_model_path(config.model.path, config.cache_dir / "models")
    tiny = config.model.tiny
    spec = TinyModelSpec(vocab_size=tiny.vocab_size, hidden_size=tiny.hidden_size,
                         num_hidden_layers=tiny.num_hidden_layers, seed=tiny.seed)
    return cached_tiny_model(config.cache_dir / "models", spec)


def build(config: ProxyServeConfig):
    """(app, router, sessions, engines) for `config`, engines started."""
    from gyre.engines.torch_rollout import TorchRolloutEngine

    path = model_dir(config)
    tokenizer = load_tokenizer(path)
    engines = [TorchRolloutEngine(path, engine_id=e.id, max_batch_size=e.max_batch_size, seed=e.seed, device=e.device)
               for e in config.engines]
    router = EngineRouter(engines, max_wait_s=config.no_engine_wait_s)
    sessions = SessionRegistry()
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
    )
    return app, router, sessions, engines


def serve(config_path: Path | str) -> None:
    config = load_proxy_config(config_path)
    app, _, sessions, engines = build(config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="info",
                                           access_log=False, lifespan="off"))
    try:
        server.run()
    finally:
        for engine in engines:
            engine.close()
        if config.record_path is not None:
            config.record_path.parent.mkdir(parents=True, exist_ok=True)
            with config.record_path.open("a") as f:
                for execution_id in config.keys.values():
                    for call in sessions.close(execution_id).calls:
                        f.write(call.model_dump_json() + "\n")
