"""Chat templates: the checkpoint's (string, named list, .jinja file), the plain default."""

from __future__ import annotations

import json

import pytest

from fsd.errors import ConfigError, ModelLoadError
from fsd.server.http.chat_template import PLAIN_TEMPLATE, ChatTemplate, normalize_messages

CHATML = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MESSAGES = [{"role": "user", "content": "Hi"}]


def checkpoint(tmp_path, **tokenizer_config):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return str(tmp_path)


def test_the_checkpoints_template_gets_its_special_tokens(tmp_path):
    src = checkpoint(tmp_path, chat_template=CHATML, bos_token="<s>", eos_token={"content": "</s>"})
    assert ChatTemplate.for_model(src).render(MESSAGES) == "<s><|user|>Hi</s><|assistant|>"
    assert (
        ChatTemplate.for_model(src).render(MESSAGES, add_generation_prompt=False).endswith("</s>")
    )


def test_a_named_template_list_uses_default_and_a_jinja_file_is_read(tmp_path):
    src = checkpoint(
        tmp_path,
        chat_template=[{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
    )
    assert ChatTemplate.for_model(src).render(MESSAGES) == "D"
    other = tmp_path / "other"
    other.mkdir()
    (other / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}")
    assert ChatTemplate.for_model(str(other)).render(MESSAGES) == "JHi"


def test_presets_and_checkpoints_without_a_template_get_the_plain_one(tmp_path):
    assert ChatTemplate.for_model("preset:tiny").source == PLAIN_TEMPLATE
    assert ChatTemplate.for_model(checkpoint(tmp_path)).source == PLAIN_TEMPLATE


def test_templates_run_sandboxed_and_their_refusals_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="only users"):
        ChatTemplate("{{ raise_exception('only users') }}").render(MESSAGES)
    with pytest.raises(ConfigError):  # no reaching Python internals from a checkpoint
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render(MESSAGES)
    with pytest.raises(ModelLoadError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_messages_are_checked_and_text_parts_joined():
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert normalize_messages(parts)[0]["content"] == "ab"
    assert normalize_messages([{"role": "assistant", "content": None}])[0]["content"] == ""
    for bad in (
        [],
        "hi",
        [{"role": "robot", "content": "x"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": [{"type": "image_url"}]}],
    ):
        with pytest.raises(ConfigError):
            normalize_messages(bad)
