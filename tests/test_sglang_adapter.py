"""The SGLang rollout adapter against a fake SGLang server (tests/sglang_fake.py), and the
rollout-engine contract it shares with the torch reference engine."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gyre.engines.base import ContextLengthError, EngineDrainingError, GenerationRequest, RolloutEngine, SamplingParams
from gyre.engines.sglang import adapter as sglang_adapter
from gyre.engines.sglang.adapter import SGLangError, SGLangRolloutEngine
from gyre.engines.torch.rollout import TorchRolloutEngine
from gyre.engines.torch.server import TorchEngineServer
from gyre.net.server_thread import ServerThread
from tests.sglang_fake import FakeSGLang

PROMPT = [5, 6, 7, 8]


@pytest.fixture
def fake():
    server = FakeSGLang(context_len=64, token_delay_s=0.002).start()
    yield server
    server.stop()


@pytest.fixture
def sglang(fake):
    engine = SGLangRolloutEngine(fake.base_url, "sglang-test")
    yield engine
    engine.close()


def _expected(fake, prompt, n, version="default"):
    pairs = [FakeSGLang.token(prompt, step, version, fake.vocab_size) for step in range(n)]
    return [t for t, _ in pairs], [lp for _, lp in pairs]


def _ask(engine, n=8, temperature=1.0, **kw):
    return engine.generate(GenerationRequest(PROMPT, SamplingParams(temperature, n), **kw))


# -- the adapter against the fake --------------------------------------------------------


def test_generate_returns_the_servers_exact_ids_and_logprobs(fake, sglang):
    assert isinstance(sglang, RolloutEngine)
    result = _ask(sglang, 10)
    ids, logprobs = _expected(fake, PROMPT, 10)
    assert result.output_ids == ids and result.logprobs == logprobs
    assert (result.finish_reason, result.policy_version, result.engine_id) == ("length", 0, "sglang-test")
    path, body = fake.calls[-1]
    assert path == "/generate" and body["input_ids"] == PROMPT and body["return_logprob"] is True
    assert body["logprob_start_len"] == -1 and body["rid"].startswith("sglang-test-")
    assert body["sampling_params"] == {"max_new_tokens": 10, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                       "stop_token_ids": []}
    assert "stream" not in body  # no hooks: one plain answer


def test_on_token_sees_each_token_as_it_is_streamed(fake, sglang):
    seen = []
    result = _ask(sglang, 12, on_token=lambda t, lp: seen.append((t, lp, len(fake.calls))))
    ids, logprobs = _expected(fake, PROMPT, 12)
    assert [(t, lp) for t, lp, _ in seen] == list(zip(ids, logprobs))
    assert result.output_ids == ids and fake.calls[-1][1]["stream"] is True


def test_a_stop_event_mid_stream_aborts_the_request_at_the_server(fake, sglang):
    stop = threading.Event()
    seen = []

    def on_token(token_id, logprob):
        seen.append(token_id)
        if len(seen) == 3:
            stop.set()

    result = _ask(sglang, 40, stop=stop, on_token=on_token)
    assert result.finish_reason == "abort" and result.output_ids == seen == _expected(fake, PROMPT, 3)[0]
    rid = fake.calls[0][1]["rid"]
    assert ("/abort_request", {"rid": rid}) in fake.calls and rid in fake.aborted


def test_a_stop_event_while_no_token_comes_is_sent_by_the_watcher(fake, sglang):
    httpx.post(f"{fake.base_url}/pause_generation", json={"mode": "in_place"}).raise_for_status()
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(_ask, sglang, 8, stop=stop)
        time.sleep(0.2)
        assert not future.done()  # held by the paused server
        stop.set()
        result = future.result(timeout=5)
    assert result.finish_reason == "abort" and result.output_ids == []
    assert fake.aborted == {fake.calls[1][1]["rid"]}


def test_a_stopped_stream_on_an_unreachable_server_is_cut_with_its_tokens(fake, sglang, monkeypatch):
    """A partition: the stream stalls after 3 tokens and the abort never arrives. The stop (a
    drain) still ends the call, STOP_GRACE_S later, with the tokens that did arrive."""
    monkeypatch.setattr(sglang_adapter, "STOP_GRACE_S", 0.5)
    monkeypatch.setattr(sglang_adapter, "ABORT_TIMEOUT_S", 0.5)
    fake.cut_after = 3
    seen, stop = [], threading.Event()
    pool = ThreadPoolExecutor(1)
    try:
        future = pool.submit(_ask, sglang, 40, stop=stop, on_token=lambda t, lp: seen.append(t))
        deadline = time.monotonic() + 10
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        assert len(seen) == 3 and not future.done()  # stalled: nothing more comes
        stopped = time.monotonic()
        stop.set()
        result = future.result(timeout=10)
        took = time.monotonic() - stopped
    finally:
        fake.heal()  # a stream left stalled (the cut failed) goes on and ends
        pool.shutdown(wait=False)
    assert result.finish_reason == "abort" and result.output_ids == seen == _expected(fake, PROMPT, 3)[0]
    assert 0.5 <= took < 5, took


def test_weight_update_names_the_version_and_records_it_only_on_success(fake, sglang, tmp_path):
    snapshot = tmp_path / "step-7"
    snapshot.mkdir()
    sglang.load_weights(snapshot, 7)
    assert sglang.policy_version == 7 and fake.weight_version == "7" and fake.model_path == str(snapshot)
    assert fake.calls[-1] == ("/update_weights_from_disk",
                              {"model_path": str(snapshot), "weight_version": "7", "flush_cache": True})
    result = _ask(sglang, 5)
    assert result.policy_version == 7 and result.output_ids == _expected(fake, PROMPT, 5, "7")[0]

    with pytest.raises(FileNotFoundError, match="gone"):
        sglang.load_weights(tmp_path / "gone", 8)
    assert sglang.policy_version == 7


def test_a_failed_server_update_is_a_clear_error_and_keeps_the_version(fake, sglang, tmp_path, monkeypatch):
    snapshot = tmp_path / "step-3"
    snapshot.mkdir()
    monkeypatch.setattr(sglang, "_model_dir_for", lambda _: tmp_path / "not-there")
    with pytest.raises(SGLangError, match=r"/update_weights_from_disk failed \(HTTP 400\): Failed to get weights"):
        sglang.load_weights(snapshot, 3)
    assert sglang.policy_version == 0 and fake.weight_version == "default"


def test_a_single_file_snapshot_is_staged_beside_the_base_models_config(fake, tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "tokenizer.json").write_text("{}")
    (base / "model.safetensors").write_bytes(b"old")
    snapshot = tmp_path / "snap" / "step-2.safetensors"
    snapshot.parent.mkdir()
    snapshot.write_bytes(b"new")
    with pytest.raises(ValueError, match="base_model_dir"):
        SGLangRolloutEngine(fake.base_url).load_weights(snapshot, 2)
    engine = SGLangRolloutEngine(fake.base_url, base_model_dir=base)
    try:
        engine.load_weights(snapshot, 2)
        staged = tmp_path / "snap" / "step-2.safetensors.sglang"
        assert fake.model_path == str(staged) and engine.policy_version == 2
        assert sorted(p.name for p in staged.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
        assert (staged / "model.safetensors").read_bytes() == b"new"
    finally:
        engine.close()


def test_server_errors_name_the_endpoint_and_status(fake, sglang):
    fake.fail_generate_status = 500
    with pytest.raises(SGLangError, match=r"/generate failed \(HTTP 500\): injected failure"):
        _ask(sglang)
    fake.fail_generate_status = None
    with pytest.raises(SGLangError, match=r"HTTP 400\): top_p must be in \(0, 1\], got 0.0"):
        sglang.generate(GenerationRequest(PROMPT, SamplingParams(top_p=0.0)))


def test_an_unreachable_server_is_retried_then_named(monkeypatch):
    monkeypatch.setattr(sglang_adapter, "RETRY_BACKOFF_S", 0.001)
    engine = SGLangRolloutEngine("http://127.0.0.1:9", context_length=64)  # discard port: nothing listens
    try:
        with pytest.raises(SGLangError, match=r"127.0.0.1:9/generate failed \(no answer\)"):
            _ask(engine)
    finally:
        engine.close()


def test_a_prompt_beyond_the_servers_context_is_a_context_length_error(fake):
    engine = SGLangRolloutEngine(fake.base_url, context_length=1000)  # believes a longer context
    try:
        with pytest.raises(ContextLengthError, match=r"longer than the model's context length \(64 tokens\)"):
            engine.generate(GenerationRequest(list(range(70)), SamplingParams(max_new_tokens=4)))
        with pytest.raises(ContextLengthError, match=r"longer than the model's context length \(64 tokens\)"):
            engine.generate(GenerationRequest(list(range(70)), SamplingParams(max_new_tokens=4),
                                              on_token=lambda t, lp: None))  # streamed: an error line
    finally:
        engine.close()


def test_max_new_tokens_is_clamped_to_the_room_left_in_the_context(fake, sglang):
    result = sglang.generate(GenerationRequest(list(range(60)), SamplingParams(max_new_tokens=50)))
    assert len(result.output_ids) == 4 and result.finish_reason == "length"


def test_truncated_sampling_uses_the_servers_sampling_logprobs(fake, sglang):
    result = sglang.generate(GenerationRequest(PROMPT, SamplingParams(1.0, 6, top_p=0.9, top_k=20)))
    ids, raw = _expected(fake, PROMPT, 6)
    assert result.output_ids == ids and result.logprobs == [min(0.0, lp + 0.25) for lp in raw]
    body = fake.calls[-1][1]
    assert body["return_sampling_mask"] is True and body["sampling_params"]["top_k"] == 20


def test_health_flush_and_model_info(fake, sglang):
    assert sglang.health() is True
    sglang.flush_cache()
    info = sglang.model_info()
    assert info["model_path"] == fake.model_path and sglang.context_length == 64
    fake.unhealthy = True
    assert sglang.health() is False
    with pytest.raises(SGLangError, match=r"/health_generate failed \(no answer\): not healthy within 0.2 s"):
        sglang.wait_healthy(0.2)


def test_the_fake_speaks_sglangs_wire_format(fake):
    stream = httpx.post(f"{fake.base_url}/generate", json={"input_ids": PROMPT, "stream": True, "return_logprob": True,
                                                          "sampling_params": {"max_new_tokens": 2}})
    lines = [line for line in stream.text.split("\n\n") if line]
    assert lines[-1] == "data: [DONE]" and len(lines) == 3
    final = httpx.Response(200, content=lines[-2][len("data: "):]).json()
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    assert [e[1] for e in final["meta_info"]["output_token_logprobs"]] == final["output_ids"]
    bad = httpx.post(f"{fake.base_url}/generate", json={"input_ids": PROMPT, "sampling_params": {"top": 1}})
    assert bad.status_code == 400 and bad.json()["error"].startswith("unknown field `top`, expected one of")
    assert httpx.post(f"{fake.base_url}/generate", content=b"[1]").json()["type"] == "Bad Request"


# -- the contract both engines keep ------------------------------------------------------


@pytest.fixture(params=["torch", "sglang", "torch-over-http"])
def engine(request, tiny_model_dir):
    if request.param == "torch":
        eng = TorchRolloutEngine(tiny_model_dir, seed=3)
        context = eng.max_context
    elif request.param == "torch-over-http":  # a cell's engine in another process, as the adapter reaches it
        served = TorchRolloutEngine(tiny_model_dir, "served", seed=3)
        app = TorchEngineServer(served, tiny_model_dir)
        thread = ServerThread(app.app, name="torch-server").start()

        def stop():
            thread.stop()
            app.close()
            served.close()

        request.addfinalizer(stop)
        eng = SGLangRolloutEngine(f"http://127.0.0.1:{thread.port}", "torch-over-http")
        context = eng.context_length
        assert context == served.max_context
    else:
        server = FakeSGLang(context_len=512, token_delay_s=0.002).start()
        request.addfinalizer(server.stop)
        eng = SGLangRolloutEngine(server.base_url, "sglang-contract")
        context = eng.context_length
    yield eng, context
    eng.close()


def test_contract_stop_tokens_length_and_a_preset_stop(engine):
    eng, _ = engine
    greedy = _ask(eng, 8, temperature=0.0)
    assert greedy.finish_reason == "length" and len(greedy.output_ids) == len(greedy.logprobs) == 8
    assert all(lp <= 0.0 for lp in greedy.logprobs)
    k = max(i for i, t in enumerate(greedy.output_ids) if t not in greedy.output_ids[:i])
    stopped = eng.generate(GenerationRequest(PROMPT, SamplingParams(0.0, 8, (greedy.output_ids[k],))))
    assert stopped.finish_reason == "stop" and stopped.output_ids == greedy.output_ids[: k + 1]
    preset = threading.Event()
    preset.set()
    aborted = _ask(eng, 8, stop=preset, on_token=lambda t, lp: pytest.fail("no token after a preset stop"))
    assert (aborted.finish_reason, aborted.output_ids, aborted.logprobs) == ("abort", [], [])


def test_contract_on_token_and_a_stop_mid_generation_agree_with_the_result(engine):
    eng, _ = engine
    stop, seen = threading.Event(), []

    def on_token(token_id, logprob):
        seen.append((token_id, logprob))
        if len(seen) == 4:
            stop.set()

    result = _ask(eng, 30, stop=stop, on_token=on_token)
    assert result.finish_reason == "abort" and list(zip(result.output_ids, result.logprobs)) == seen
    assert len(seen) == 4


def test_contract_context_length(engine):
    eng, context = engine
    with pytest.raises(ContextLengthError, match=f"context is {context}"):
        eng.generate(GenerationRequest([1] * context, SamplingParams(max_new_tokens=1)))


def test_contract_paused_engine_holds_requests_until_resumed(engine):
    eng, _ = engine
    eng.pause()
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(_ask, eng) for _ in range(2)]
        time.sleep(0.3)
        assert not any(f.done() for f in futures)
        eng.resume()
        assert all(len(f.result(timeout=30).output_ids) == 8 for f in futures)


def test_contract_drain_finishes_queued_work_refuses_new_and_resume_reopens(engine):
    eng, _ = engine
    eng.pause()
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_ask, eng, 16) for _ in range(4)]
        time.sleep(0.2)
        assert eng.drain(timeout_s=60) is True
        assert all(len(f.result(timeout=5).output_ids) == 16 for f in futures)
    with pytest.raises(EngineDrainingError):
        _ask(eng)
    eng.resume()
    assert len(_ask(eng).output_ids) == 8
