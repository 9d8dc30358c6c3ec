"""Qwen (ChatML) and Mistral ([INST]) chat templates, as their checkpoints ship them.

Each template is written here into a tokenizer_config.json beside a byte-level
tokenizer.json with the family's special tokens (nothing is downloaded). The
templates are those of Qwen2.5-Instruct, Qwen3 (without its tool-call branches),
and Mistral-7B-Instruct v0.1 and v0.3 (without tools): namespaces, reversed slices,
string methods, selectattr and raise_exception all run in fsd's sandbox, and the
rendered prompt encodes with each special token as one id.
"""

from __future__ import annotations

import json

import pytest

from fsd.errors import ConfigError
from fsd.server.http.chat_template import ChatTemplate
from fsd.tokenizer import HFTokenizer
from tests.models.hf_fixtures import MISTRAL_SPECIALS, QWEN_SPECIALS, make_tokenizer_json

QWEN25 = """{%- if tools %}{{- raise_exception('no tools here') }}{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

QWEN3 = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

MISTRAL_V01 = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)

MISTRAL_V03 = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

CHAT = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]
SYSTEM = {"role": "system", "content": "Be terse."}


def _checkpoint(tmp_path, specials, bos, eos, template):
    make_tokenizer_json(tmp_path, specials, bos)
    cfg = {"bos_token": bos, "eos_token": {"content": eos}, "chat_template": template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return str(tmp_path), HFTokenizer.from_dir(tmp_path)


def _qwen(tmp_path, template):
    return _checkpoint(tmp_path, QWEN_SPECIALS, None, "<|im_end|>", template)


def test_qwen25_chatml(tmp_path):
    src, tok = _qwen(tmp_path, QWEN25)
    t = ChatTemplate.for_model(src)
    assert t.render([SYSTEM, *CHAT]) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    default = t.render(CHAT[:1], add_generation_prompt=False)
    assert default.startswith("<|im_start|>system\nYou are Qwen") and default.endswith(
        "Hi<|im_end|>\n"
    )
    ids = tok.encode(t.render(CHAT), add_special_tokens=False)
    ((start,), (end,)) = (tok.encode(s, add_special_tokens=False) for s in QWEN_SPECIALS[1:])
    assert ids[0] == start and ids.count(start) == 5 and ids.count(end) == 4
    assert tok.eos_token_id == end
    tool = t.render(
        [*CHAT[:1], {"role": "tool", "content": "42"}, {"role": "tool", "content": "7"}]
    )
    assert "<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n7" in tool


def test_qwen3_thinking_template(tmp_path):
    src, _ = _qwen(tmp_path, QWEN3)
    t = ChatTemplate.for_model(src)
    history = [*CHAT[:1], {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello!"}]
    assert t.render([*history, CHAT[2]]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )  # reasoning of earlier turns is dropped
    last = t.render(history, add_generation_prompt=False)
    assert last.endswith("<|im_start|>assistant\n<think>\nhm\n</think>\n\nHello!<|im_end|>\n")


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (MISTRAL_V01, "<s>[INST] Hi [/INST]Hello!</s>[INST] Bye [/INST]"),
        (MISTRAL_V03, "<s>[INST] Hi[/INST] Hello!</s>[INST] Bye[/INST]"),
    ],
    ids=["v0.1", "v0.3"],
)
def test_mistral_inst(tmp_path, template, expected):
    src, tok = _checkpoint(tmp_path, MISTRAL_SPECIALS, "<s>", "</s>", template)
    t = ChatTemplate.for_model(src)
    assert t.render(CHAT) == expected
    ids = tok.encode(expected, add_special_tokens=False)
    assert ids[0] == tok.bos_token_id == 1 and ids.count(2) == 1  # one <s>, one </s>
    with pytest.raises(ConfigError, match="alternate"):
        t.render([CHAT[0], CHAT[0]])


def test_mistral_v03_puts_the_system_message_in_the_last_turn(tmp_path):
    src, _ = _checkpoint(tmp_path, MISTRAL_SPECIALS, "<s>", "</s>", MISTRAL_V03)
    rendered = ChatTemplate.for_model(src).render([SYSTEM, *CHAT])
    assert rendered == "<s>[INST] Hi[/INST] Hello!</s>[INST] Be terse.\n\nBye[/INST]"
