"""Chat messages → one prompt string, the way the checkpoint's tokenizer config says.

A HuggingFace checkpoint carries its template as `chat_template` in
tokenizer_config.json (a string, or a list of named templates of which "default"
is used) or as a `chat_template.jinja` file beside it. Presets have none and get a
plain "role: content" transcript. Templates run in jinja2's sandbox, as
transformers runs them, so a checkpoint cannot reach Python objects through one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from fsd.errors import ConfigError, ModelLoadError
from fsd.tokenizer import read_json_side_file

# A transcript any base model can continue; the trailing "assistant:" cues its turn.
PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatTemplate:
    """A compiled chat template with the special-token strings it may use."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ModelLoadError(f"the chat template does not compile: {exc}") from None
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    @classmethod
    def for_model(cls, source: str) -> ChatTemplate:
        """The template of a checkpoint directory; the plain one for a preset or none."""
        path = Path(source)
        if source.startswith("preset:") or not path.is_dir():
            return cls(PLAIN_TEMPLATE)
        cfg = read_json_side_file(path / "tokenizer_config.json")
        template = _pick(cfg.get("chat_template"))
        jinja_file = path / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        return cls(
            template or PLAIN_TEMPLATE,
            _token_text(cfg.get("bos_token")),
            _token_text(cfg.get("eos_token")),
        )

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt for `messages` (already checked by `normalize_messages`)."""
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as exc:  # includes raise_exception() from the template itself
            raise ConfigError(f"the model's chat template refused these messages: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a template may trip on any value a client sends
            # (a number where it adds strings, a deep structure it serializes): the
            # messages' fault as far as the client can tell, and never the server's
            raise ConfigError(
                f"the model's chat template failed on these messages: {type(exc).__name__}: "
                f"{str(exc)[:200]}"
            ) from None


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages as plain dicts with string content; ConfigError if malformed.

    Content may be a string or a list of {"type": "text", "text": ...} parts (joined);
    other part types (images, audio) are refused: fsd serves text models.
    """
    if not isinstance(messages, list) or not messages:
        raise ConfigError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ConfigError(f"messages[{i}] must be an object with role and content")
        role = msg.get("role")
        if role not in ROLES:
            raise ConfigError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}; got {_short(role)}"
            )
        out.append({**msg, "content": _content_text(msg.get("content"), i)})
    return out


def _content_text(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ConfigError(
                    f"messages[{i}].content: only text parts are supported, got {_short(kind)}"
                )
            text = part.get("text", "")
            if not isinstance(text, str):
                raise ConfigError(f"messages[{i}].content: a text part's text must be a string")
            texts.append(text)
        return "".join(texts)
    raise ConfigError(f"messages[{i}].content must be a string or a list of text parts")


def _short(value: Any) -> str:
    """A client's value in an error message, cut short (a body may hold megabytes)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _pick(value: Any) -> str | None:
    """tokenizer_config's chat_template: a string, or [{name, template}, ...] ("default")."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default") or next(iter(named.values()), None)
        return chosen if isinstance(chosen, str) else None
    return None


def _token_text(token: Any) -> str:
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else ""


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    raise TemplateError(message)
