"""The torch engine behind SGLang's HTTP API (`gyre/engines/torch/server.py`), reached through
the SGLang adapter as a remote cell's engine is: same tokens and log-probs as the engine
called directly, weight updates by version, and a bad snapshot refused with the old weights kept.
(The rollout-engine contract itself runs over HTTP in tests/test_sglang_adapter.py.)"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file, save_model

from gyre.engines.base import GenerationRequest, SamplingParams
from gyre.engines.models.hf import load_causal_lm
from gyre.engines.sglang.adapter import SGLangError, SGLangRolloutEngine
from gyre.engines.torch.rollout import TorchRolloutEngine
from gyre.engines.torch.server import TorchEngineServer
from gyre.net.server_thread import ServerThread

PROMPT = [5, 17, 42, 99, 3, 250, 7]


@pytest.fixture
def served(tiny_model_dir):
    engine = TorchRolloutEngine(tiny_model_dir, "served", seed=0)
    server = TorchEngineServer(engine, tiny_model_dir)
    thread = ServerThread(server.app, name="torch-server").start()
    remote = SGLangRolloutEngine(f"http://127.0.0.1:{thread.port}", "remote", base_model_dir=tiny_model_dir)
    yield engine, remote
    remote.close()
    thread.stop()
    server.close()
    engine.close()


def _greedy(engine, n=12, **kw):
    return engine.generate(GenerationRequest(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=n), **kw))


def test_over_http_the_tokens_and_logprobs_are_the_engines_own(served, tiny_model_dir):
    engine, remote = served
    direct = TorchRolloutEngine(tiny_model_dir, "direct", seed=0)
    try:
        want = _greedy(direct)
        got = _greedy(remote)
        streamed = _greedy(remote, on_token=lambda t, lp: None)  # the streamed path
        assert got.output_ids == streamed.output_ids == want.output_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-6)
        assert streamed.logprobs == pytest.approx(want.logprobs, abs=1e-6)
        assert got.policy_version == 0 and got.engine_id == "remote"
    finally:
        direct.close()


def test_a_published_snapshot_is_loaded_by_version_and_a_bad_one_keeps_the_old_weights(served, tiny_model_dir,
                                                                                       tmp_path):
    engine, remote = served
    model = load_causal_lm(tiny_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    snapshot = tmp_path / "policy-v000003.safetensors"
    save_model(model, str(snapshot))
    before = _greedy(remote)
    remote.load_weights(snapshot, 3)  # a single file is staged beside the base model's config, as for SGLang
    after = _greedy(remote)
    assert remote.policy_version == engine.policy_version == 3 and after.policy_version == 3
    assert after.output_ids != before.output_ids or after.logprobs != before.logprobs
    direct = TorchRolloutEngine(tiny_model_dir, "direct", seed=0)
    try:
        direct.load_weights(snapshot, 3)
        assert _greedy(direct).output_ids == after.output_ids
    finally:
        direct.close()
    wrong = tmp_path / "policy-v000004.safetensors"
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(wrong))
    with pytest.raises(SGLangError, match="update_weights_from_disk"):
        remote.load_weights(wrong, 4)
    assert remote.policy_version == engine.policy_version == 3
    assert _greedy(remote).output_ids == after.output_ids


def test_a_snapshot_that_does_not_fit_is_refused_whole_naming_the_tensor(tiny_model_dir, tmp_path):
    engine = TorchRolloutEngine(tiny_model_dir, "direct", seed=0)
    try:
        before = _greedy(engine)
        model = load_causal_lm(tiny_model_dir)
        tensors = {k: v.clone() + 1.0 for k, v in model.state_dict().items() if k != "lm_head.weight"}
        name = next(k for k in tensors if k.endswith("mlp.down_proj.weight"))
        tensors[name] = tensors[name][:, :-1].contiguous()  # every other tensor fits and differs
        bad = tmp_path / "bad.safetensors"
        save_file(tensors, str(bad))
        with pytest.raises(ValueError, match=f"tensor '{name}' has shape"):
            engine.load_weights(bad, 1)
        del tensors[name]
        save_file(tensors, str(bad))
        with pytest.raises(ValueError, match=f"tensor '{name}' is missing"):
            engine.load_weights(bad, 1)
        assert engine.policy_version == 0 and _greedy(engine).logprobs == before.logprobs  # nothing was mixed in
    finally:
        engine.close()
