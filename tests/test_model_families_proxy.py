"""Qwen2.5, Qwen3, Llama 3.1 and Llama 3.2 model directories through the proxy, end to end.

Each family gets a tiny random model directory (transformers config of the family, 2 layers,
hidden 32), a small byte-level BPE tokenizer carrying the family's control tokens with the
family's ids-order, flags and pre-tokenizer, and the family's chat template
(`tests/fixtures/chat_templates/`). The proxy then serves OpenAI chat completions with `tools`
from it, and a tool-result turn after it, and the tests check:

- the prompt the engine gets is the template's own rendering (`tokenizer.apply_chat_template`
  with the same messages and tools), token for token, one BOS for Llama;
- a model output in the family's tool-call format comes back as OpenAI `tool_calls` with the
  right name and arguments (Qwen3's reasoning as `reasoning_content`, never parsed for calls);
- the tool result turn renders in the family's way (`<tool_response>` in a user turn for Qwen,
  an `ipython` turn for Llama, whose templates write a plain-text result as a JSON string) and
  the sampled ids of the call come back verbatim (TITO, no fallback).

The model edge is scripted (`FamilyEngine`: fixed texts, each ended by the family's end token);
one test per family runs the real torch engine on the directory instead.

Where each template's format comes from (read with the search tools; the fixtures are gyre's
own Jinja, checked to render byte-identically to the real templates, see the fixtures'
README.md):

- Qwen2.5-Instruct: ggerganov/llama.cpp `tests/chat/templates/Qwen-Qwen2.5-7B-Instruct.jinja`
  (commit eaca756ecca033e6fdd241dad091974a2c0354ff), Qwen/Qwen2.5-7B-Instruct's template.
- Qwen3: ye-NX/llama.cpp (a fork of ggml-org/llama.cpp) `models/templates/Qwen-Qwen3-0.6B.jinja`
  (commit b354d7c9ecb76c97c07098617cdebbdfffa2583e), Qwen/Qwen3-0.6B's template.
- Llama 3.1: ye-NX/llama.cpp `models/templates/meta-llama-Llama-3.3-70B-Instruct.jinja` (same
  commit): the Llama 3.1 template, which Llama 3.3 ships unchanged (llama.cpp's own table of
  templates puts both under "llama 3.x tool calls (w/ builtin tools)"); Meta-Llama-3.1-8B-
  Instruct's own copy was not readable here.
- Llama 3.2: ggerganov/llama.cpp `models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja`
  (commit 7b5e0803c84435e8005725d8f9ddceb5d1820443).
- Special tokens: Qwen3's `tokenizer_config.json` layout (151643 `<|endoftext|>` ... 151668
  `</think>`; `<tool_call>`, `<tool_response>`, `<think>` and their closers are added tokens
  with `special: false`); Qwen2.5 lacks `<tool_response>`/`<think>`; Llama 3.x: 128000
  `<|begin_of_text|>`, 128001 `<|end_of_text|>`, 128006/7 headers, 128008 `<|eom_id|>`, 128009
  `<|eot_id|>`, 128010 `<|python_tag|>`, all special; the instruct models' eos is `<|eot_id|>`.
- Tool-call output: vLLM `vllm/entrypoints/openai/tool_parsers/llama_tool_parser.py`
  (`<|python_tag|>` optional, `parameters` or `arguments`, calls separated by `;`), the Qwen
  templates' own instructions (`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gyre.engines.base import GenerationRequest, GenerationResult
from gyre.engines.models.hf import load_tokenizer, stop_token_ids
from gyre.proxy.app import create_app
from gyre.proxy.router import EngineRouter
from gyre.net.server_thread import ServerThread
from gyre.proxy.sessions import SessionRegistry
from gyre.proxy.toolcalls import parser_for

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN25_TOKENS = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                 ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
                 ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
                 ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
                 ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
                 ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
                 ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
                 ("<|file_sep|>", False)]
QWEN3_TOKENS = QWEN25_TOKENS + [("<tool_response>", False), ("</tool_response>", False),
                                ("<think>", False), ("</think>", False)]
LLAMA_TOKENS = [("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|reserved_special_token_0|>", True),
                ("<|reserved_special_token_1|>", True), ("<|finetune_right_pad_id|>", True),
                ("<|reserved_special_token_2|>", True), ("<|start_header_id|>", True),
                ("<|end_header_id|>", True), ("<|eom_id|>", True), ("<|eot_id|>", True), ("<|python_tag|>", True)]

WRITE = {"path": "calc.py", "content": "def add(a, b):\n    return a + b\n"}
TOOLS = [
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a file in the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command — output returned as text.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}},
]
SYSTEM = "You are a coding agent. Use the tools."
USER = "Create calc.py with add(a, b)."
RESULT = "wrote calc.py (31 bytes)"


@dataclass(frozen=True)
class Family:
    name: str
    template: str
    config: str  # transformers config class
    model: str  # transformers causal-LM class
    tokens: list[tuple[str, bool]]
    split: str
    bos: str | None
    eos: str
    pad: str | None
    parser: str
    call_text: str  # the model's tool call for write_file(WRITE), in the family's format
    call_end: str  # the token that ends that output
    end: str  # the token that ends a plain answer
    after_end: str  # what the template writes after an assistant turn's end token
    result_turn: str  # how the template writes RESULT as a tool result


QWEN_CALL = '<tool_call>\n{"name": "write_file", "arguments": ' + json.dumps(WRITE) + "}\n</tool_call>"
FAMILIES = {
    "qwen2.5": Family(
        "qwen2.5", "qwen2.5-instruct.jinja", "Qwen2Config", "Qwen2ForCausalLM", QWEN25_TOKENS, QWEN_SPLIT,
        None, "<|im_end|>", "<|endoftext|>", "qwen", QWEN_CALL, "<|im_end|>", "<|im_end|>", "\n",
        f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>\n"),
    "qwen3": Family(
        "qwen3", "qwen3.jinja", "Qwen3Config", "Qwen3ForCausalLM", QWEN3_TOKENS, QWEN_SPLIT,
        None, "<|im_end|>", "<|endoftext|>", "qwen",
        # reasoning that mentions a call must not become one
        '<think>\nI need calc.py. A <tool_call>{"name": "run_shell", "arguments": {"cmd": "rm -rf /"}}</tool_call> '
        "would be wrong.\n</think>\n\n" + QWEN_CALL, "<|im_end|>", "<|im_end|>", "\n",
        f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>\n"),
    "llama3.1": Family(
        "llama3.1", "llama3.1-instruct.jinja", "LlamaConfig", "LlamaForCausalLM", LLAMA_TOKENS, LLAMA_SPLIT,
        "<|begin_of_text|>", "<|eot_id|>", None, "llama3",
        '<|python_tag|>{"name": "write_file", "parameters": ' + json.dumps(WRITE) + "}", "<|eom_id|>",
        "<|eot_id|>", "", f"<|start_header_id|>ipython<|end_header_id|>\n\n{json.dumps(RESULT)}<|eot_id|>"),
    "llama3.2": Family(
        "llama3.2", "llama3.2-instruct.jinja", "LlamaConfig", "LlamaForCausalLM", LLAMA_TOKENS, LLAMA_SPLIT,
        "<|begin_of_text|>", "<|eot_id|>", None, "llama3",
        '{"name": "write_file", "parameters": ' + json.dumps(WRITE) + "}", "<|eot_id|>",
        "<|eot_id|>", "", f"<|start_header_id|>ipython<|end_header_id|>\n\n{json.dumps(RESULT)}<|eot_id|>"),
}
CORPUS = [
    SYSTEM, USER, RESULT, json.dumps(TOOLS), json.dumps(TOOLS, indent=4), json.dumps(WRITE),
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt. Respond in the format {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}. Do not use variables. Cutting Knowledge Date: December 2023",
    "# Tools You may call one or more functions to assist with the user query. You are provided with function "
    "signatures within <tools></tools> XML tags. For each function call, return a json object with function "
    "name and arguments within XML tags. You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
]


def _tokenizer(family: Family):
    """A small byte-level BPE with the family's pre-tokenizer and control tokens, in the family's
    order (ids after the learned vocabulary, as the real ones sit after theirs)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(family.split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    core.train_from_iterator(CORPUS * 4, trainer=trainer)
    for content, special in family.tokens:
        token = AddedToken(content, special=special, normalized=False)
        (core.add_special_tokens if special else core.add_tokens)([token])
    if family.bos is not None:  # Llama 3's tokenizer adds BOS itself when asked for special tokens
        bos_id = core.token_to_id(family.bos)
        core.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", pair=f"{family.bos} $A {family.bos} $B", special_tokens=[(family.bos, bos_id)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=family.bos, eos_token=family.eos,
                                        pad_token=family.pad)
    tokenizer.chat_template = (TEMPLATES / family.template).read_text()
    return tokenizer


def _model_dir(root: Path, family: Family) -> Path:
    import torch
    import transformers

    out = root / family.name
    tokenizer = _tokenizer(family)
    tokenizer.save_pretrained(out)
    config = getattr(transformers, family.config)(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
        eos_token_id=tokenizer.convert_tokens_to_ids(family.eos),
        bos_token_id=tokenizer.convert_tokens_to_ids(family.bos) if family.bos else None,
        pad_token_id=tokenizer.convert_tokens_to_ids(family.pad) if family.pad else None,
    )
    torch.manual_seed(0)
    getattr(transformers, family.model)(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: _model_dir(root, family) for name, family in FAMILIES.items()}


class FamilyEngine:
    """The model edge scripted: each request is answered with the next (text, end token)."""

    def __init__(self, tokenizer, replies: list[tuple[str, str | None]]) -> None:
        self.engine_id, self.policy_version = "scripted-0", 0
        self._tokenizer, self._replies = tokenizer, list(replies)
        self._lock = threading.Lock()
        self.prompts: list[list[int]] = []

    def generate(self, request: GenerationRequest) -> GenerationResult:
        with self._lock:
            self.prompts.append(list(request.prompt_ids))
            text, end = self._replies.pop(0)
        ids = self._tokenizer(text, add_special_tokens=False)["input_ids"]
        if end is not None:  # None: cut at the token limit, no end token
            ids.append(self._tokenizer.convert_tokens_to_ids(end))
        for tid in ids if request.on_token is not None else ():
            request.on_token(tid, -1.0)
        return GenerationResult(ids, [-1.0] * len(ids), "stop" if end else "length", 0, self.engine_id)

    def load_weights(self, snapshot, version: int) -> None:
        self.policy_version = version

    def close(self) -> None:
        pass


def _serve(engine, tokenizer, family: Family):
    sessions = SessionRegistry()
    app = create_app(EngineRouter([engine]), sessions, tokenizer, model_name=family.name,
                     stop_token_ids=stop_token_ids(tokenizer), parser=parser_for(family.parser))
    return ServerThread(app).start(), sessions


def _post(server, key, body):
    r = httpx.post(f"{server.base_url}/chat/completions", json=body,
                   headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _render(tokenizer, messages, tools, generation_prompt=True) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def _template_turn(message: dict) -> dict:
    """The returned OpenAI message as a template sees it: arguments as objects."""
    out = {"role": "assistant", "content": message["content"] or ""}
    if message.get("reasoning_content") is not None:
        out["reasoning_content"] = message["reasoning_content"]
    out["tool_calls"] = [
        {"id": tc["id"], "type": "function",
         "function": {"name": tc["function"]["name"], "arguments": json.loads(tc["function"]["arguments"])}}
        for tc in message["tool_calls"]]
    return out


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tool_call_turn_and_tool_result_in_the_family_format(family_dirs, name):
    family = FAMILIES[name]
    tokenizer = load_tokenizer(family_dirs[name])
    assert tokenizer.chat_template == (TEMPLATES / family.template).read_text()
    engine = FamilyEngine(tokenizer, [(family.call_text, family.call_end), ("Done: calc.py is written.", family.end)])
    server, sessions = _serve(engine, tokenizer, family)
    key = sessions.mint("e")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    try:
        first = _post(server, key, {"model": name, "messages": messages, "tools": TOOLS})
        returned = first["choices"][0]["message"]
        result = {"role": "tool", "tool_call_id": returned["tool_calls"][0]["id"], "content": RESULT}
        second = _post(server, key, {"model": name, "messages": messages + [returned, result], "tools": TOOLS})
    finally:
        server.stop()
    session = sessions.close("e")

    # 1. the prompt is the template's own rendering, token for token
    rendered = _render(tokenizer, messages, TOOLS)
    assert engine.prompts[0] == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    if family.bos is not None:
        bos = tokenizer.convert_tokens_to_ids(family.bos)
        assert engine.prompts[0][0] == bos and engine.prompts[0][1] != bos  # one BOS: the template's

    # 2. the family's tool-call text comes back as an OpenAI tool call
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    (call,) = returned["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "write_file"
    assert json.loads(call["function"]["arguments"]) == WRITE
    assert not returned["content"]
    if name == "qwen3":
        assert returned["reasoning_content"].startswith("\nI need calc.py.")  # the mention is not a call

    # 3. the tool result turn renders the family's way, after the exact sampled ids of the call
    turn = _template_turn(returned)
    conversation = messages + [turn, {"role": "tool", "tool_call_id": call["id"], "content": RESULT}]
    with_turn = _render(tokenizer, messages + [turn], TOOLS, generation_prompt=False)
    rendered2 = _render(tokenizer, conversation, TOOLS)
    assert rendered2.startswith(with_turn)
    assert rendered2[len(with_turn):].startswith(family.result_turn)
    calls = session.calls
    head = calls[0].prompt_ids + calls[0].output_ids
    assert engine.prompts[1][: len(head)] == head
    rest = tokenizer.decode(engine.prompts[1][len(head):], skip_special_tokens=False)
    assert rest == family.after_end + rendered2[len(with_turn):]
    assert session.fallback_turns == 0
    assert second["choices"][0]["message"]["content"] == "Done: calc.py is written."
    assert second["choices"][0]["finish_reason"] == "stop"


def test_qwen3_drops_old_reasoning_at_a_new_query_and_the_turn_falls_back(family_dirs):
    """Qwen3's template keeps an assistant turn's reasoning only after the latest user query: within
    an agent's tool loop the sampled ids are spliced back; once a new user message arrives the
    earlier turn renders without its `<think>` block, no longer matches what was sampled, and is
    tokenised from the template (one fallback turn; the next prompt no longer extends the last
    call's ids, so it starts a new trajectory)."""
    family = FAMILIES["qwen3"]
    tokenizer = load_tokenizer(family_dirs["qwen3"])
    engine = FamilyEngine(tokenizer, [("<think>\nShort question.\n</think>\n\nHello.", "<|im_end|>"),
                                      ("Bye.", "<|im_end|>")])
    server, sessions = _serve(engine, tokenizer, family)
    key = sessions.mint("e")
    messages = [{"role": "user", "content": "Hi"}]
    try:
        returned = _post(server, key, {"messages": messages})["choices"][0]["message"]
        assert returned["reasoning_content"] == "\nShort question.\n" and returned["content"] == "Hello."
        conversation = messages + [returned, {"role": "user", "content": "Bye"}]
        _post(server, key, {"messages": conversation})
    finally:
        server.stop()
    session = sessions.close("e")
    rendered = _render(tokenizer, [messages[0], {"role": "assistant", "content": "Hello.",
                                                 "reasoning_content": "\nShort question.\n"},
                                   conversation[-1]], None)
    assert "<think>" not in rendered  # dropped: the turn is before the latest query
    assert engine.prompts[1] == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert session.fallback_turns == 1  # counted; no span: the template rewrote history (prompt.py)
    first = session.calls[0]
    assert engine.prompts[1][: len(first.prompt_ids) + len(first.output_ids)] != first.prompt_ids + first.output_ids


@pytest.mark.parametrize("name", list(FAMILIES))
def test_streamed_tool_call_says_what_the_plain_response_says(family_dirs, name):
    family = FAMILIES[name]
    tokenizer = load_tokenizer(family_dirs[name])
    text = "Let me write it.\n" + family.call_text.split("</think>\n\n")[-1]
    engine = FamilyEngine(tokenizer, [(text, family.call_end)] * 2)
    server, sessions = _serve(engine, tokenizer, family)
    key = sessions.mint("e")
    body = {"model": name, "messages": [{"role": "user", "content": USER}], "tools": TOOLS}
    try:
        plain = _post(server, key, body)["choices"][0]["message"]
        content, calls = "", []
        with httpx.stream("POST", f"{server.base_url}/chat/completions", json=dict(body, stream=True),
                          headers={"Authorization": f"Bearer {key}"}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    choices = json.loads(line[6:])["choices"]
                    delta = choices[0]["delta"] if choices else {}
                    content += delta.get("content") or ""
                    calls += delta.get("tool_calls") or []
    finally:
        server.stop()
    assert plain["content"] == content == "Let me write it."
    assert [c["function"]["name"] for c in calls] == ["write_file"]
    assert json.loads(calls[0]["function"]["arguments"]) == json.loads(plain["tool_calls"][0]["function"]["arguments"]) == WRITE


@pytest.mark.parametrize("name", list(FAMILIES))
def test_real_torch_engine_serves_the_family_dir(family_dirs, name):
    from gyre.engines.torch.rollout import TorchRolloutEngine

    family = FAMILIES[name]
    tokenizer = load_tokenizer(family_dirs[name])
    engine = TorchRolloutEngine(family_dirs[name], seed=3, prefix_cache_bytes=0)
    server, sessions = _serve(engine, tokenizer, family)
    key = sessions.mint("e")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    try:
        body = _post(server, key, {"model": name, "messages": messages, "tools": TOOLS, "max_tokens": 6})
    finally:
        server.stop()
        engine.close()
    (call,) = sessions.close("e").calls
    assert call.prompt_ids == tokenizer(_render(tokenizer, messages, TOOLS), add_special_tokens=False)["input_ids"]
    assert 1 <= len(call.output_ids) <= 6 and len(call.logprobs) == len(call.output_ids)
    assert body["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_turn_cut_at_the_token_limit_is_closed_in_the_next_prompt(family_dirs, name):
    """An output cut at max_tokens has no end token; the next prompt closes the turn as the
    template does (`<|im_end|>` for Qwen, `<|eot_id|>` for Llama) after the sampled ids."""
    family = FAMILIES[name]
    tokenizer = load_tokenizer(family_dirs[name])
    engine = FamilyEngine(tokenizer, [("I will write calc.py", None), ("ok", family.end)])
    server, sessions = _serve(engine, tokenizer, family)
    key = sessions.mint("e")
    messages = [{"role": "user", "content": USER}]
    try:
        first = _post(server, key, {"messages": messages, "max_tokens": 5})["choices"][0]
        assert first["finish_reason"] == "length"
        _post(server, key, {"messages": messages + [first["message"], {"role": "user", "content": "go on"}]})
    finally:
        server.stop()
    (call, _) = sessions.close("e").calls
    head = call.prompt_ids + call.output_ids
    assert engine.prompts[1][: len(head)] == head
    rest = tokenizer.decode(engine.prompts[1][len(head):], skip_special_tokens=False)
    assert rest.startswith(family.end + family.after_end)  # Llama's <|eot_id|> too (`end_of_turn_for`)


@pytest.mark.parametrize("name", ["llama3.1", "llama3.2"])
def test_llama_end_of_message_ends_a_call(family_dirs, name):
    """Llama 3.1 ends a `<|python_tag|>` call with `<|eom_id|>` (its generation_config lists
    128001, 128008 and 128009 as eos): the engine must stop there."""
    tokenizer = load_tokenizer(family_dirs[name])
    ids = stop_token_ids(tokenizer)
    assert tokenizer.convert_tokens_to_ids("<|eot_id|>") in ids
    assert tokenizer.convert_tokens_to_ids("<|eom_id|>") in ids


# -- the parsers alone --------------------------------------------------------------------------

LS = {"cmd": "ls"}


@pytest.mark.parametrize("text, content, expected", [
    ('{"name": "run_shell", "parameters": {"cmd": "ls"}}', "", [("run_shell", LS)]),  # Llama 3.2, custom tools
    ('<|python_tag|>{"name": "run_shell", "parameters": {"cmd": "ls"}}', "", [("run_shell", LS)]),  # Llama 3.1
    ('<|python_tag|>{"name": "run_shell", "parameters": {"cmd": "ls"}}<|eom_id|>', "", [("run_shell", LS)]),
    ('\n  {"name": "run_shell", "arguments": {"cmd": "ls"}}  \n', "", [("run_shell", LS)]),  # "arguments" too
    ('{"name": "run_shell", "parameters": "{\\"cmd\\": \\"ls\\"}"}', "", [("run_shell", LS)]),  # JSON text
    ('Listing first.\n{"name": "run_shell", "parameters": {"cmd": "ls"}}', "Listing first.", [("run_shell", LS)]),
    ('{"name": "finish", "parameters": {}}', "", [("finish", {})]),
])
def test_llama3_parser_reads_the_forms_llama_models_write(text, content, expected):
    got_content, calls = parser_for("llama3").parse(text)
    assert got_content == content and [(c.name, c.arguments) for c in calls] == expected


@pytest.mark.parametrize("text", [
    "The file is written.",
    '{"name": "Ada", "age": 36}',  # a JSON answer, not a call
    '{"name": "run_shell", "parameters": {"cmd": "ls"}, "arguments": {}}',  # both keys
    '{"name": "run_shell", "parameters": ["ls"]}',
    '{"name": "run_shell", "parameters": {"cmd": "ls"}} and then more text',
    'Run {"name": "run_shell", "parameters": {"cmd": "ls"}} inline',  # a call starts the text or a line
    '<|python_tag|>brave_search.call(query="gyre")',  # built-in tools' Python form: not read
    '{"name": "run_shell", "parameters": {"cmd": "ls"}} {"name": "run_shell", "parameters": {}}',  # no separator
    '{"name": "run_shell", "parameters": {"cmd": "ls"}}; {"name": "run_shell", "parameters": {"cmd": "pwd"}}',
])
def test_llama3_parser_leaves_everything_else_as_content(text):
    assert parser_for("llama3").parse(text) == (text, [])


def test_llama3_parser_reads_several_calls_when_the_template_can_render_them():
    from gyre.proxy.toolcalls import Llama3ToolCallParser

    parser = Llama3ToolCallParser(max_calls=None)
    for text in ('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}',
                 '<|python_tag|>{"name": "a", "parameters": {}};\n{"name": "b", "arguments": {"x": 1}}',
                 '{"name": "a", "parameters": {}}\n{"name": "b", "parameters": {"x": 1}}'):
        content, calls = parser.parse(text)
        assert content == "" and [(c.name, c.arguments) for c in calls] == [("a", {}), ("b", {"x": 1})]


def test_llama_output_with_two_calls_stays_content_and_the_conversation_goes_on(family_dirs):
    """The Llama 3.x templates raise on an assistant turn with two calls: returned as calls, the
    turn could never be rendered again (the proxy would fail remembering it, the harness's next
    request would be refused). As content, the next turn renders."""
    family = FAMILIES["llama3.1"]
    tokenizer = load_tokenizer(family_dirs["llama3.1"])
    two = '{"name": "run_shell", "parameters": {"cmd": "ls"}}; {"name": "run_shell", "parameters": {"cmd": "pwd"}}'
    engine = FamilyEngine(tokenizer, [(two, "<|eot_id|>"), ("ok", "<|eot_id|>")])
    server, sessions = _serve(engine, tokenizer, family)
    key = sessions.mint("e")
    messages = [{"role": "user", "content": USER}]
    try:
        first = _post(server, key, {"messages": messages, "tools": TOOLS})["choices"][0]
        assert first["finish_reason"] == "stop" and first["message"]["content"] == two
        assert "tool_calls" not in first["message"]
        again = messages + [first["message"], {"role": "user", "content": "Call one tool at a time."}]
        assert _post(server, key, {"messages": again, "tools": TOOLS})["choices"][0]["message"]["content"] == "ok"
    finally:
        server.stop()
    assert sessions.close("e").fallback_turns == 0


@pytest.mark.parametrize("text, content, names", [
    # Qwen3-2507 thinking templates write `<think>\n` into the prompt: the output starts inside it
    ('I could <tool_call>\n{"name": "run_shell", "arguments": {"cmd": "rm -rf /"}}\n</tool_call> but no.\n</think>\n\n'
     '<tool_call>\n{"name": "run_shell", "arguments": {"cmd": "ls"}}\n</tool_call>',
     'I could <tool_call>\n{"name": "run_shell", "arguments": {"cmd": "rm -rf /"}}\n</tool_call> but no.\n</think>',
     ["run_shell"]),
    ("Only thoughts.</think>\n\nNo call.", "Only thoughts.</think>\n\nNo call.", []),
    # `</think>` inside a call's arguments is not the end of reasoning
    ('<tool_call>\n{"name": "write_file", "arguments": {"path": "t.txt", "content": "</think>"}}\n</tool_call>',
     "", ["write_file"]),
])
def test_qwen_parser_never_reads_calls_in_reasoning(text, content, names):
    got, calls = parser_for("qwen").parse(text)
    assert got == content and [c.name for c in calls] == names


def test_proxy_config_names_the_llama3_parser():
    from gyre.proxy.config import ProxyServeConfig
    from gyre.proxy.toolcalls import Llama3ToolCallParser, QwenToolCallParser

    config = ProxyServeConfig(engines=[{"id": "e0"}], tool_parser="llama3")
    assert isinstance(parser_for(config.tool_parser), Llama3ToolCallParser)
    assert isinstance(parser_for(ProxyServeConfig(engines=[{"id": "e0"}]).tool_parser), QwenToolCallParser)


# -- the fixtures against the real templates, where they are at hand ----------------------------

REAL = {"qwen2.5-instruct.jinja": "Qwen2.5-7B-Instruct", "qwen3.jinja": "Qwen3-0.6B",
        "llama3.1-instruct.jinja": "Llama-3.1-8B-Instruct or Llama-3.3-70B-Instruct",
        "llama3.2-instruct.jinja": "Llama-3.2-3B-Instruct"}


@pytest.mark.parametrize("fixture", list(REAL))
def test_fixture_renders_what_the_real_template_renders(fixture):
    """Set GYRE_REAL_CHAT_TEMPLATES to a directory holding the models' own templates under the
    fixtures' file names (each model's `chat_template.jinja`, or its tokenizer_config.json's
    `chat_template`) to check the fixtures against them (README.md in the fixtures' folder)."""
    import itertools
    import os

    from transformers.utils.chat_template_utils import _compile_jinja_template

    real_dir = os.environ.get("GYRE_REAL_CHAT_TEMPLATES")
    if not real_dir or not (Path(real_dir) / fixture).is_file():
        pytest.skip(f"GYRE_REAL_CHAT_TEMPLATES/{fixture} ({REAL[fixture]}'s own template) is not here")
    real = _compile_jinja_template((Path(real_dir) / fixture).read_text())
    ours = _compile_jinja_template((TEMPLATES / fixture).read_text())
    call = {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": WRITE}}
    conversations = [
        [{"role": "user", "content": USER}],
        [{"role": "system", "content": SYSTEM + "  \n"}, {"role": "user", "content": " " + USER + "\n"},
         {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "more"}],
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER},
         {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": RESULT},
         {"role": "tool", "content": "second"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\ndone"}],
        [{"role": "user", "content": USER}, {"role": "assistant", "content": "x", "reasoning_content": "\nr\n",
                                             "tool_calls": [call]}, {"role": "tool", "content": RESULT}],
    ]
    extras = [{}, {"enable_thinking": False}, {"tools_in_user_message": False}, {"date_string": "01 Jan 2025"},
              {"builtin_tools": ["brave_search"]}]
    for messages, tools, gen, extra in itertools.product(conversations, [None, TOOLS], [False, True], extras):
        kwargs = dict(messages=messages, tools=tools, add_generation_prompt=gen, bos_token="<|begin_of_text|>",
                      **extra)
        outs = []
        for template in (real, ours):
            try:
                outs.append(template.render(**kwargs))
            except Exception as exc:  # the templates refuse the same conversations the same way
                outs.append(f"{type(exc).__name__}: {exc}")
        assert outs[0] == outs[1], (messages, tools, gen, extra)
